#ifndef CASBOX_EVENTS_H
#define CASBOX_EVENTS_H

/* The "casbox" event category, defined by the storage plugin (the
   doveadm plugin resolves it from there). Its parent is Dovecot's
   "storage", as sdbox's and mdbox's are: the storage class gives it to
   every storage, mailbox and mail event of casbox users, and doveadm
   casbox commands to theirs. The named events: doc/events.md. */
extern struct event_category event_category_casbox;

#endif
