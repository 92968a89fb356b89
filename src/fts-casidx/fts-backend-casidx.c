/* fts-casidx backend vfuncs. Foundation stage: the backend registers and
   initialises, indexes nothing and claims no search args, so Dovecot
   answers every SEARCH itself (correct, not yet fast). */

#include "lib.h"
#include "mail-storage.h"
#include "fts-api-private.h"
#include "fts-casidx-plugin.h"

struct casidx_fts_backend {
	struct fts_backend backend;
};

struct casidx_fts_backend_update_context {
	struct fts_backend_update_context ctx;
};

static struct fts_backend *fts_backend_casidx_alloc(void)
{
	struct casidx_fts_backend *backend;

	backend = i_new(struct casidx_fts_backend, 1);
	backend->backend = fts_backend_casidx;
	return &backend->backend;
}

static int
fts_backend_casidx_init(struct fts_backend *backend ATTR_UNUSED,
			const char **error_r ATTR_UNUSED)
{
	return 0;
}

static void fts_backend_casidx_deinit(struct fts_backend *_backend)
{
	struct casidx_fts_backend *backend =
		container_of(_backend, struct casidx_fts_backend, backend);

	i_free(backend);
}

static int
fts_backend_casidx_get_last_uid(struct fts_backend *backend ATTR_UNUSED,
				struct mailbox *box ATTR_UNUSED,
				uint32_t *last_uid_r)
{
	*last_uid_r = 0;
	return 0;
}

static struct fts_backend_update_context *
fts_backend_casidx_update_init(struct fts_backend *backend)
{
	struct casidx_fts_backend_update_context *ctx;

	ctx = i_new(struct casidx_fts_backend_update_context, 1);
	ctx->ctx.backend = backend;
	return &ctx->ctx;
}

static int
fts_backend_casidx_update_deinit(struct fts_backend_update_context *_ctx)
{
	int ret = _ctx->failed ? -1 : 0;

	i_free(_ctx);
	return ret;
}

static void
fts_backend_casidx_update_set_mailbox(struct fts_backend_update_context *ctx
				      ATTR_UNUSED,
				      struct mailbox *box ATTR_UNUSED)
{
}

static void
fts_backend_casidx_update_expunge(struct fts_backend_update_context *ctx
				  ATTR_UNUSED, uint32_t uid ATTR_UNUSED)
{
}

static bool
fts_backend_casidx_update_set_build_key(struct fts_backend_update_context *ctx
					ATTR_UNUSED,
					const struct fts_backend_build_key *key
					ATTR_UNUSED)
{
	return FALSE;
}

static void
fts_backend_casidx_update_unset_build_key(struct fts_backend_update_context
					  *ctx ATTR_UNUSED)
{
}

static int
fts_backend_casidx_update_build_more(struct fts_backend_update_context *ctx
				     ATTR_UNUSED,
				     const unsigned char *data ATTR_UNUSED,
				     size_t size ATTR_UNUSED)
{
	return 0;
}

static int fts_backend_casidx_refresh(struct fts_backend *backend ATTR_UNUSED)
{
	return 0;
}

static bool
fts_backend_casidx_can_lookup(struct fts_backend *backend ATTR_UNUSED,
			      const struct mail_search_arg *args ATTR_UNUSED)
{
	return FALSE;
}

static int
fts_backend_casidx_lookup(struct fts_backend *backend ATTR_UNUSED,
			  struct mailbox *box,
			  struct mail_search_arg *args ATTR_UNUSED,
			  enum fts_lookup_flags flags ATTR_UNUSED,
			  struct fts_result *result)
{
	result->box = box;
	return 0;
}

struct fts_backend fts_backend_casidx = {
	.name = "casidx",
	.flags = FTS_BACKEND_FLAG_FUZZY_SEARCH,
	.v = {
		.alloc = fts_backend_casidx_alloc,
		.init = fts_backend_casidx_init,
		.deinit = fts_backend_casidx_deinit,
		.get_last_uid = fts_backend_casidx_get_last_uid,
		.update_init = fts_backend_casidx_update_init,
		.update_deinit = fts_backend_casidx_update_deinit,
		.update_set_mailbox = fts_backend_casidx_update_set_mailbox,
		.update_expunge = fts_backend_casidx_update_expunge,
		.update_set_build_key = fts_backend_casidx_update_set_build_key,
		.update_unset_build_key =
			fts_backend_casidx_update_unset_build_key,
		.update_build_more = fts_backend_casidx_update_build_more,
		.refresh = fts_backend_casidx_refresh,
		.can_lookup = fts_backend_casidx_can_lookup,
		.lookup = fts_backend_casidx_lookup,
	},
};
