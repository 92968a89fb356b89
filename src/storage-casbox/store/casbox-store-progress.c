/* casbox-store-progress: progress lines on a terminal (casbox-store-progress.h). */

#include "lib.h"
#include "time-util.h"
#include "casbox-store-progress.h"

#include <stdio.h>
#include <unistd.h>
#include <sys/time.h>

static bool progress_shown = FALSE;
static struct timeval progress_last;

static void casbox_admin_progress_vline(bool force, const char *fmt,
					va_list args) ATTR_FORMAT(2, 0);

static void casbox_admin_progress_vline(bool force, const char *fmt,
					va_list args)
{
	struct timeval now;

	if (!isatty(STDERR_FILENO))
		return;
	/* at most ten updates a second: the terminal is not the work */
	if (gettimeofday(&now, NULL) < 0)
		i_fatal("gettimeofday() failed: %m");
	if (!force && progress_shown &&
	    timeval_diff_msecs(&now, &progress_last) < 100)
		return;
	progress_last = now;
	/* \r and erase to the end of the line: one line, updated */
	fprintf(stderr, "\r%s\033[K", t_strdup_vprintf(fmt, args));
	fflush(stderr);
	progress_shown = TRUE;
}

void casbox_admin_progress_line(bool force, const char *fmt, ...)
{
	va_list args;

	va_start(args, fmt);
	T_BEGIN {
		casbox_admin_progress_vline(force, fmt, args);
	} T_END;
	va_end(args);
}

void casbox_admin_progress(const char *what, unsigned int done,
			   unsigned int total)
{
	casbox_admin_progress_line(done == total, "%s: %u/%u",
				   what, done, total);
}

static const char *casbox_admin_progress_size(uint64_t bytes)
{
	return t_strdup_printf("%"PRIu64".%"PRIu64" MB", bytes / 1000000,
			       (bytes / 100000) % 10);
}

void casbox_admin_progress_bytes(bool force, const char *what,
				 const char *count, uint64_t bytes_done,
				 uint64_t bytes_total)
{
	unsigned int percent = bytes_total == 0 ? 100 :
		(unsigned int)(bytes_done * 100 / bytes_total);

	if (!isatty(STDERR_FILENO))
		return;
	T_BEGIN {
		casbox_admin_progress_line(force, "%s: %s, %s of %s (%u%%)",
			what, count, casbox_admin_progress_size(bytes_done),
			casbox_admin_progress_size(bytes_total), percent);
	} T_END;
}

void casbox_admin_progress_end(void)
{
	if (progress_shown) {
		fprintf(stderr, "\n");
		progress_shown = FALSE;
	}
}

void casbox_admin_scan_progress_init(struct casbox_admin_scan_progress *p,
				     const char *what,
				     const struct casbox_census_pack *packs,
				     unsigned int pack_count)
{
	unsigned int i;

	i_zero(p);
	p->what = what;
	p->packs = packs;
	p->pack_count = pack_count;
	for (i = 0; i < pack_count; i++)
		p->bytes_total += packs[i].size;
}

void casbox_admin_scan_progress_frame(struct casbox_admin_scan_progress *p,
				      uint32_t pack_id, uint64_t offset,
				      uint32_t frame_size)
{
	unsigned int i;

	p->frames++;
	if (!isatty(STDERR_FILENO))
		return;
	/* packs are scanned in id order */
	if (pack_id != p->cur_pack_id) {
		p->bytes_before = 0;
		for (i = 0; i < p->pack_count; i++) {
			if (p->packs[i].pack_id < pack_id)
				p->bytes_before += p->packs[i].size;
		}
		p->cur_pack_id = pack_id;
	}
	T_BEGIN {
		uint64_t done = p->bytes_before + offset + frame_size;

		casbox_admin_progress_bytes(done >= p->bytes_total, p->what,
			t_strdup_printf("pack frames: %"PRIu64, p->frames),
			done, p->bytes_total);
	} T_END;
}

void casbox_admin_census_progress(void *context, uint64_t frames,
				  uint64_t bytes_done, uint64_t bytes_total)
{
	const char *what = context;

	if (!isatty(STDERR_FILENO))
		return;
	T_BEGIN {
		casbox_admin_progress_bytes(bytes_done >= bytes_total, what,
			t_strdup_printf("pack frames: %"PRIu64, frames),
			bytes_done, bytes_total);
	} T_END;
}

void casbox_admin_census_show_progress(struct casbox_census *census,
				       const char *what)
{
	census->progress = casbox_admin_census_progress;
	census->progress_context = (void *)what;
}
