#ifndef CASBOX_STORE_PROGRESS_H
#define CASBOX_STORE_PROGRESS_H

/* casbox-store-progress: progress of long store runs for doveadm casbox
   (scrub, gc, rebuild --from-packs, key rotate), on stderr and only when stderr is a terminal: one line,
   rewritten in place at most ten times a second, ended by
   casbox_admin_progress_end(). Run from cron or a script (stderr a file
   or a pipe), nothing is printed. Needs only Dovecot's liblib. */

#include "casbox-store-census.h"

/* force: print now even within the rate limit (e.g. the last update). */
void casbox_admin_progress_line(bool force, const char *fmt, ...)
	ATTR_FORMAT(2, 3);
/* "<what>: <done>/<total>", forced when done == total. */
void casbox_admin_progress(const char *what, unsigned int done,
			   unsigned int total);
/* "<what>: <count>, 7.8 MB of 15.6 MB (50%)"; count is e.g. "pack
   frames: 1234" or "blobs decoded: 6/9". */
void casbox_admin_progress_bytes(bool force, const char *what,
				 const char *count, uint64_t bytes_done,
				 uint64_t bytes_total);
/* End the line (a newline), if one was shown. */
void casbox_admin_progress_end(void);

/* A pack scan's progress in bytes over all packs, which are scanned in
   pack id order: set up with the store's packs (their sizes), then
   call _frame() for every frame the scan returns. */
struct casbox_admin_scan_progress {
	const char *what;
	const struct casbox_census_pack *packs;
	unsigned int pack_count;
	uint64_t frames, bytes_before, bytes_total;
	uint32_t cur_pack_id;
};
void casbox_admin_scan_progress_init(struct casbox_admin_scan_progress *p,
				     const char *what,
				     const struct casbox_census_pack *packs,
				     unsigned int pack_count);
void casbox_admin_scan_progress_frame(struct casbox_admin_scan_progress *p,
				      uint32_t pack_id, uint64_t offset,
				      uint32_t frame_size);
/* casbox_census_progress_callback_t for census->progress, with
   context = the "what" string (e.g. "scrub"). */
void casbox_admin_census_progress(void *context, uint64_t frames,
				  uint64_t bytes_done, uint64_t bytes_total);
/* Show census's pack scan progress as "<what>: ..." lines (sets
   census->progress to the above). A call, so the doveadm plugin takes
   no function address from lib20_casbox_plugin.so (it must load with
   lazy binding before the symbols resolve). */
void casbox_admin_census_show_progress(struct casbox_census *census,
				       const char *what);

#endif
