/* The shared write lock: a process-shared, robust pthread mutex in the
   first page of <dir>/LOCK, mapped by every handle, plus a stamp of the
   store's state as the last lock holder left it (doc/casbox-lsm.md,
   "Write lock"). Taking and releasing an uncontended mutex costs no
   system call, and a reader or writer whose state equals a clean stamp
   knows without any stat() that nothing changed.

   Lifetime: every handle holds an OFD read lock on byte 0 of LOCK (and
   a shared flock) while it is open. A handle that gets the write lock
   on byte 0 instead is alone with the file, so it (re)initialises the
   page: this is what makes a mutex word left over from a crash or a
   reboot harmless (a clean stamp is kept: lsm_shm_reinit()). The OFD
   read lock and the flock also keep builds
   without the shared lock (which take a whole-file fcntl or flock
   write lock per batch) from writing while this build has the store
   open: they time out instead.

   A holder that dies has its mutex handed to the next locker with
   EOWNERDEAD by the kernel; it never cleared "dirty", so the next
   locker re-reads the WAL and cuts the torn tail as before. */

#include "lib.h"
#include "casbox-lsm-state.h"

#ifdef LSM_HAVE_SHM

#include <fcntl.h>
#include <signal.h>
#include <time.h>
#include <pthread.h>
#include <sys/file.h>
#include <sys/mman.h>

#define LSM_SHM_MAGIC "CBXSHM01"
#define LSM_SHM_VERSION 1
#define LSM_SHM_SIZE 4096

struct casbox_lsm_shm {
	char magic[8];
	uint32_t version;
	uint32_t struct_size;
	pthread_mutex_t mutex;
	/* The stamp: changed only by the mutex holder, under a sequence
	   count (odd while it changes) so lock-free readers can tell a
	   consistent copy. dirty = a holder may have changed files since
	   the last stamp (set at lock, cleared by a clean unlock). */
	uint64_t seq;
	uint32_t dirty;
	uint32_t unused;
	uint64_t generation, wal_no, wal_end;
};

static int lsm_ofd_lock(int fd, short type, bool wait)
{
	struct flock fl;

	i_zero(&fl);
	fl.l_type = type;
	fl.l_whence = SEEK_SET;
	fl.l_start = 0;
	fl.l_len = 1;
	return fcntl(fd, wait ? F_OFD_SETLKW : F_OFD_SETLK, &fl);
}

static void lsm_shm_init(struct casbox_lsm_shm *shm)
{
	pthread_mutexattr_t attr;

	memset(shm, 0, sizeof(*shm));
	if (pthread_mutexattr_init(&attr) != 0 ||
	    pthread_mutexattr_setpshared(&attr, PTHREAD_PROCESS_SHARED) != 0 ||
	    pthread_mutexattr_setrobust(&attr, PTHREAD_MUTEX_ROBUST) != 0 ||
	    pthread_mutex_init(&shm->mutex, &attr) != 0)
		i_panic("casbox-lsm: cannot create a robust shared mutex");
	(void)pthread_mutexattr_destroy(&attr);
	shm->dirty = 1;
	shm->version = LSM_SHM_VERSION;
	shm->struct_size = sizeof(*shm);
	memcpy(shm->magic, LSM_SHM_MAGIC, sizeof(shm->magic));
}

static bool lsm_shm_valid(const struct casbox_lsm_shm *shm)
{
	return memcmp(shm->magic, LSM_SHM_MAGIC, sizeof(shm->magic)) == 0 &&
		shm->version == LSM_SHM_VERSION &&
		shm->struct_size == sizeof(*shm);
}

/* We are alone with the page: a new mutex (the old one may belong to a
   thread that is gone), and the stamp the last holder left, if it left
   it clean. A stamp only ever tells a handle that its own state, read
   from the files after it took its OFD read lock, is still current; no
   handle has such state yet, and every write from now on goes through
   the mutex (the read lock keeps other writers out), so an old stamp
   is as good as a new one. It saves the first refresh of every handle
   (an LMTP delivery opens the store alone and did three full ones). */
static void lsm_shm_reinit(struct casbox_lsm_shm *shm)
{
	uint64_t generation = shm->generation, wal_no = shm->wal_no;
	uint64_t wal_end = shm->wal_end;
	bool clean = lsm_shm_valid(shm) && (shm->seq & 1) == 0 &&
		shm->dirty == 0;

	lsm_shm_init(shm);
	if (clean) {
		shm->generation = generation;
		shm->wal_no = wal_no;
		shm->wal_end = wal_end;
		shm->dirty = 0;
	}
}

static int lsm_shm_wait_shared(struct casbox_lsm *lsm, const char **error_r)
{
	int ret;

	/* an initialiser holds byte 0 only for a moment; SIGALRM (which
	   Dovecot lets interrupt) bounds the wait anyway */
	alarm(lsm->lock_timeout_secs);
	ret = lsm_ofd_lock(lsm->lock_fd, F_RDLCK, TRUE);
	alarm(0);
	if (ret == 0)
		return 0;
	if (errno == EINTR) {
		*error_r = t_strdup_printf(
			"Timeout (%us) while waiting for lock %s",
			lsm->lock_timeout_secs, lsm->lock_path);
	} else {
		*error_r = t_strdup_printf("fcntl(%s, F_OFD_SETLKW) failed: "
					   "%m", lsm->lock_path);
	}
	return -1;
}

static int lsm_shm_map(struct casbox_lsm *lsm, const char **error_r)
{
	void *map;

	map = mmap(NULL, LSM_SHM_SIZE, PROT_READ | PROT_WRITE, MAP_SHARED,
		   lsm->lock_fd, 0);
	if (map == MAP_FAILED) {
		*error_r = t_strdup_printf("mmap(%s) failed: %m",
					   lsm->lock_path);
		return -1;
	}
	lsm->shm = map;
	return 0;
}

/* We hold byte 0 exclusively: nobody else has the store open. */
static int lsm_shm_create(struct casbox_lsm *lsm, const char **error_r)
{
	static const unsigned char zeros[LSM_SHM_SIZE];
	struct stat st;
	ssize_t ret;

	if (fstat(lsm->lock_fd, &st) < 0) {
		*error_r = t_strdup_printf("fstat(%s) failed: %m",
					   lsm->lock_path);
		return -1;
	}
	if (st.st_size < LSM_SHM_SIZE) {
		/* real blocks, so a write to the mapping never needs disk
		   space later (that would be SIGBUS) */
		ret = pwrite(lsm->lock_fd, zeros, sizeof(zeros), 0);
		if (ret != (ssize_t)sizeof(zeros)) {
			if (ret >= 0)
				errno = ENOSPC;
			*error_r = t_strdup_printf("write(%s) failed: %m",
						   lsm->lock_path);
			return -1;
		}
	}
	if (lsm_shm_map(lsm, error_r) < 0)
		return -1;
	lsm_shm_reinit(lsm->shm);
	/* atomically down to shared: from now on others may use it */
	if (lsm_ofd_lock(lsm->lock_fd, F_RDLCK, FALSE) < 0) {
		*error_r = t_strdup_printf("fcntl(%s, F_OFD_SETLK) failed: %m",
					   lsm->lock_path);
		return -1;
	}
	return 0;
}

/* We hold byte 0 shared. Returns 1 ok, 0 nobody initialised the page
   (the exclusive holder was a build without the shared lock), -1
   error. */
static int lsm_shm_attach(struct casbox_lsm *lsm, const char **error_r)
{
	struct stat st;

	if (fstat(lsm->lock_fd, &st) < 0) {
		*error_r = t_strdup_printf("fstat(%s) failed: %m",
					   lsm->lock_path);
		return -1;
	}
	if (st.st_size < LSM_SHM_SIZE)
		return 0;
	if (lsm_shm_map(lsm, error_r) < 0)
		return -1;
	if (lsm_shm_valid(lsm->shm))
		return 1;
	casbox_lsm_shm_close(lsm);
	return 0;
}

int casbox_lsm_shm_open(struct casbox_lsm *lsm, const char **error_r)
{
	unsigned int attempt;
	int ret;

	for (attempt = 0;; attempt++) {
		if (lsm_ofd_lock(lsm->lock_fd, F_WRLCK, FALSE) == 0) {
			if (lsm_shm_create(lsm, error_r) < 0)
				return -1;
			break;
		}
		if (errno != EAGAIN && errno != EACCES) {
			*error_r = t_strdup_printf(
				"fcntl(%s, F_OFD_SETLK) failed: %m",
				lsm->lock_path);
			return -1;
		}
		if (lsm_shm_wait_shared(lsm, error_r) < 0)
			return -1;
		ret = lsm_shm_attach(lsm, error_r);
		if (ret != 0) {
			if (ret < 0)
				return -1;
			break;
		}
		/* let go and race for the exclusive lock again */
		if (lsm_ofd_lock(lsm->lock_fd, F_UNLCK, FALSE) < 0 ||
		    attempt == 10) {
			*error_r = t_strdup_printf("%s has no valid lock page "
				"while in use", lsm->lock_path);
			return -1;
		}
	}
	if (flock(lsm->lock_fd, LOCK_SH | LOCK_NB) == 0)
		return 0;
	/* only a build without the shared lock holds LOCK_EX, and only
	   for one batch */
	alarm(lsm->lock_timeout_secs);
	ret = flock(lsm->lock_fd, LOCK_SH);
	alarm(0);
	if (ret == 0)
		return 0;
	*error_r = errno == EINTR ? t_strdup_printf(
		"Timeout (%us) while waiting for lock %s",
		lsm->lock_timeout_secs, lsm->lock_path) :
		t_strdup_printf("flock(%s) failed: %m", lsm->lock_path);
	return -1;
}

void casbox_lsm_shm_close(struct casbox_lsm *lsm)
{
	if (lsm->shm == NULL)
		return;
	if (munmap(lsm->shm, LSM_SHM_SIZE) < 0)
		i_error("munmap(%s) failed: %m", lsm->lock_path);
	lsm->shm = NULL;
	/* closing lock_fd drops the OFD lock and the flock */
}

static void lsm_shm_stamp_begin(struct casbox_lsm_shm *shm)
{
	__atomic_store_n(&shm->seq, shm->seq + 1, __ATOMIC_RELAXED);
	__atomic_thread_fence(__ATOMIC_RELEASE);
}

static void lsm_shm_stamp_end(struct casbox_lsm_shm *shm)
{
	__atomic_store_n(&shm->seq, shm->seq + 1, __ATOMIC_RELEASE);
}

int casbox_lsm_shm_lock(struct casbox_lsm *lsm, const char **error_r)
{
	struct casbox_lsm_shm *shm = lsm->shm;
	struct timespec ts;
	bool owner_died = FALSE;
	int ret;

	ret = pthread_mutex_trylock(&shm->mutex);
	if (ret == EBUSY) {
		if (clock_gettime(CLOCK_REALTIME, &ts) < 0)
			i_fatal("clock_gettime() failed: %m");
		ts.tv_sec += lsm->lock_timeout_secs;
		do {
			ret = pthread_mutex_timedlock(&shm->mutex, &ts);
		} while (ret == EINTR);
	}
	if (ret == EOWNERDEAD) {
		/* the holder died; dirty is still set (it never unlocked
		   cleanly), so we re-read and cut its torn tail */
		if (pthread_mutex_consistent(&shm->mutex) != 0)
			i_panic("pthread_mutex_consistent() failed");
		owner_died = TRUE;
		ret = 0;
	}
	if (ret == ETIMEDOUT) {
		*error_r = t_strdup_printf(
			"Timeout (%us) while waiting for lock %s",
			lsm->lock_timeout_secs, lsm->lock_path);
		lsm->lock_timed_out = TRUE;
		return -1;
	}
	if (ret != 0) {
		errno = ret;
		*error_r = t_strdup_printf("pthread_mutex_lock(%s) failed: %m",
					   lsm->lock_path);
		return -1;
	}
	if ((shm->seq & 1) != 0) {
		/* a holder died inside a stamp: dirty is still set unless
		   the fields were complete, so even is safe again */
		__atomic_store_n(&shm->seq, shm->seq + 1, __ATOMIC_RELEASE);
		owner_died = TRUE;
	}
	/* did the last holder leave the store exactly as we know it? */
	lsm->shm_current = !owner_died && shm->dirty == 0 &&
		shm->generation == lsm->generation &&
		shm->wal_no == lsm->wal_no &&
		shm->wal_end == lsm->wal_offset;
	lsm_shm_stamp_begin(shm);
	__atomic_store_n(&shm->dirty, 1, __ATOMIC_RELAXED);
	lsm_shm_stamp_end(shm);
	return 0;
}

void casbox_lsm_shm_unlock(struct casbox_lsm *lsm, bool current)
{
	struct casbox_lsm_shm *shm = lsm->shm;

	if (current && !lsm->broken && lsm->wal_file_size == lsm->wal_offset) {
		lsm_shm_stamp_begin(shm);
		__atomic_store_n(&shm->generation, lsm->generation,
				 __ATOMIC_RELAXED);
		__atomic_store_n(&shm->wal_no, lsm->wal_no, __ATOMIC_RELAXED);
		__atomic_store_n(&shm->wal_end, lsm->wal_offset,
				 __ATOMIC_RELAXED);
		__atomic_store_n(&shm->dirty, 0, __ATOMIC_RELAXED);
		lsm_shm_stamp_end(shm);
	}
	lsm->shm_current = FALSE;
	if (pthread_mutex_unlock(&shm->mutex) != 0)
		i_panic("pthread_mutex_unlock(%s) failed", lsm->lock_path);
}

bool casbox_lsm_shm_unchanged(struct casbox_lsm *lsm)
{
	struct casbox_lsm_shm *shm = lsm->shm;
	uint64_t seq1, seq2, generation, wal_no, wal_end;
	uint32_t dirty;

	seq1 = __atomic_load_n(&shm->seq, __ATOMIC_ACQUIRE);
	if ((seq1 & 1) != 0)
		return FALSE;
	dirty = __atomic_load_n(&shm->dirty, __ATOMIC_RELAXED);
	generation = __atomic_load_n(&shm->generation, __ATOMIC_RELAXED);
	wal_no = __atomic_load_n(&shm->wal_no, __ATOMIC_RELAXED);
	wal_end = __atomic_load_n(&shm->wal_end, __ATOMIC_RELAXED);
	__atomic_thread_fence(__ATOMIC_ACQUIRE);
	seq2 = __atomic_load_n(&shm->seq, __ATOMIC_RELAXED);
	return seq1 == seq2 && dirty == 0 &&
		generation == lsm->generation && wal_no == lsm->wal_no &&
		wal_end == lsm->wal_offset;
}

#endif
