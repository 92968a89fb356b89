/* casbox-store-objstore: what doveadm asks of sealed packs in object
   storage (casbox_pack_storage; doc/casbox-storage.md "Packs in object
   storage"), over the pack store the store opened. The doveadm plugin
   calls these instead of the blob layer (doc/architecture.md). */

#include "lib.h"
#include "array.h"
#include "casbox-pack.h"
#include "casbox-store.h"
#include "casbox-store-census.h"
#include "casbox-store-objstore.h"

bool casbox_store_has_remote(struct casbox_store *store)
{
	struct casbox_pack_store *packs = casbox_store_get_packs(store);

	return packs != NULL && casbox_pack_store_has_remote(packs);
}

int casbox_store_upload(struct casbox_store *store, bool seal,
			const char **error_r)
{
	struct casbox_pack_store *packs = casbox_store_get_packs(store);

	i_assert(packs != NULL);
	if (seal && casbox_pack_store_seal_current(packs, error_r) < 0)
		return -1;
	return casbox_pack_store_upload(packs, TRUE, error_r) < 0 ? -1 : 0;
}

void casbox_store_upload_summary(struct casbox_store *store,
				 const char *root_dir,
				 struct casbox_store_upload_summary *sum_r)
{
	struct casbox_pack_store *packs = casbox_store_get_packs(store);
	const struct casbox_pack_upload_stats *stats;
	ARRAY_TYPE(casbox_census_pack) list;
	const struct casbox_census_pack *pack;
	const char *error;
	uint64_t size;
	bool is_remote;

	i_zero(sum_r);
	if (packs == NULL)
		return;
	stats = casbox_pack_store_get_upload_stats(packs);
	sum_r->uploaded_packs = stats->packs;
	sum_r->uploaded_bytes = stats->bytes;
	if (casbox_census_list_packs(root_dir, pool_datastack_create(),
				     &list, &error) < 0)
		return;
	array_foreach(&list, pack) {
		if (casbox_pack_store_pack_size(packs, pack->pack_id, &size,
						&is_remote, &error) <= 0)
			continue;
		if (is_remote)
			sum_r->remote_packs++;
		else
			sum_r->local_packs++;
	}
}

int casbox_store_adopt_remote(struct casbox_store *store,
			      unsigned int *adopted_r, const char **error_r)
{
	struct casbox_pack_store *packs = casbox_store_get_packs(store);

	*adopted_r = 0;
	i_assert(packs != NULL);
	return casbox_pack_store_adopt_remote(packs, adopted_r, error_r) < 0 ?
		-1 : 0;
}
