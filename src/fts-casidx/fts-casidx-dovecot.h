#ifndef FTS_CASIDX_DOVECOT_H
#define FTS_CASIDX_DOVECOT_H

/* The FTS API differences between Dovecot 2.3 and 2.4 that the backend
   meets inline (CASBOX_DOVECOT_API from configure); whole functions
   that differ live in *-23.c / *-24.c. */

#if CASBOX_DOVECOT_API >= 24
/* 2.4's fts_backend has its own event (with the "fts casidx { }"
   filter); debug logging comes from the log_debug setting. */
#  define CASIDX_EVENT_PARENT(backend) ((backend)->event)
#  define CASIDX_USER_MAIL_DEBUG(user) FALSE
#else
#  define CASIDX_EVENT_PARENT(backend) ((backend)->ns->user->event)
#  define CASIDX_USER_MAIL_DEBUG(user) ((user)->mail_debug)
#endif

#endif
