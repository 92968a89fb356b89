#ifndef DOVEADM_CASBOX_STDIN_H
#define DOVEADM_CASBOX_STDIN_H

/* Secrets (passwords) for doveadm casbox commands, read from stdin so
   they never appear in argv, the environment or a log. */

/* Longest accepted line, newline excluded. */
#define CASBOX_DOVEADM_SECRET_MAX_LEN 1024

/* Read exactly count lines from fd 0, each with its trailing "\n" or
   "\r\n" stripped (the last may lack it; a lone trailing "\r" is
   stripped too, as casbox_key_input_lines() does). Nothing is read past the last line
   (a byte at a time), so stdin stays usable. The strings live in
   sodium_malloc()ed memory; free them with
   casbox_doveadm_secret_lines_free(), which wipes them. Returns 0 ok,
   -1 error: end of input before a line (error_r says "no ... on
   stdin"), an empty line, a NUL byte, a line longer than the maximum,
   a read error. On error nothing is left allocated, and error_r never
   contains the input. */
int casbox_doveadm_read_secret_lines(unsigned int count,
				     const char *const **lines_r,
				     const char **error_r);
/* Wipe and free what casbox_doveadm_read_secret_lines() returned; sets
   *lines to NULL. NULL is accepted. */
void casbox_doveadm_secret_lines_free(const char *const **lines);

#endif
