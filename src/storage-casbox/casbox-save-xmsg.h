#ifndef CASBOX_SAVE_XMSG_H
#define CASBOX_SAVE_XMSG_H

/* The save's side of cross-message compression (casbox-xmsg.h): the
   hints of a message from its header. */

#include "casbox-xmsg.h"

struct istream;

/* Read input's header (from offset 0) into hints_r, allocated from
   pool: Message-ID, the parent (In-Reply-To, else the last References
   id) and the first From address (lowercased). A field that is missing
   or does not parse is NULL. Returns 0 ok, -1 read error. */
int casbox_save_xmsg_hints(struct istream *input, pool_t pool,
			   struct casbox_xmsg_hints *hints_r,
			   const char **error_r);

#endif
