#ifndef CASBOX_STORE_OBJSTORE_H
#define CASBOX_STORE_OBJSTORE_H

/* Sealed packs in object storage, for doveadm (casbox upload, rebuild
   --from-packs). Each needs the store's packs open
   (casbox_store_open_keys() or casbox_store_open_packs_keyless()). */

struct casbox_store;

/* TRUE if casbox_pack_storage sends sealed packs to object storage. */
bool casbox_store_has_remote(struct casbox_store *store);

/* Upload every sealed local pack now, ignoring the backoff of earlier
   failures; seal: first start a new pack if the current one holds any
   frame, so everything acknowledged is uploaded. Returns 0 ok, -1 error
   (the packs stay local). */
int casbox_store_upload(struct casbox_store *store, bool seal,
			const char **error_r);

/* What this process uploaded, and where the store's packs are now. */
struct casbox_store_upload_summary {
	unsigned int uploaded_packs;
	uint64_t uploaded_bytes;
	unsigned int local_packs, remote_packs;
};
void casbox_store_upload_summary(struct casbox_store *store,
				 const char *root_dir,
				 struct casbox_store_upload_summary *sum_r);

/* Write local stubs for the packs object storage has and this store
   does not know (rebuild --from-packs on a new server): *adopted_r of
   them. Returns 0 ok (also without object storage), -1 error. */
int casbox_store_adopt_remote(struct casbox_store *store,
			      unsigned int *adopted_r, const char **error_r);

#endif
