#ifndef CASBOX_PLUGIN_H
#define CASBOX_PLUGIN_H

/* Log prefix used by every casbox log line. */
#define CASBOX_LOG_PREFIX "casbox: "

extern const char *casbox_plugin_version;

void casbox_plugin_init(struct module *module);
void casbox_plugin_deinit(void);

#endif
