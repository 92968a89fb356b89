#ifndef CASBOX_EVENTS_H
#define CASBOX_EVENTS_H

/* The "casbox" event category belongs to the storage plugin. Its parent
   is Dovecot's "storage", as sdbox's and mdbox's are: the storage class
   gives it to every storage, mailbox and mail event of casbox users.
   The named events: doc/events.md. */

struct event;

/* A new child of parent with the casbox category (doveadm casbox
   commands' events). A function, not the category itself: the doveadm
   plugin must load without the storage plugin's data symbols (they
   resolve at load time, functions at first call). */
struct event *casbox_event_create(struct event *parent);

#endif
