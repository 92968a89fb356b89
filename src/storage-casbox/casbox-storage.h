#ifndef CASBOX_STORAGE_H
#define CASBOX_STORAGE_H

#include "index-storage.h"

#define CASBOX_STORAGE_NAME "casbox"

struct casbox_storage {
	struct mail_storage storage;
};

extern struct mail_storage casbox_storage;

#endif
