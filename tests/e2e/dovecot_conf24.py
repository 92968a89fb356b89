"""dovecot.conf for Dovecot 2.4 from a harness Dovecot() instance.

The tests describe an instance in 2.3 terms (mail_location, a plugin {}
dict, 2.3 %-variables, small extra_conf snippets); this module writes the
same configuration in 2.4's syntax (doc/settings.md, "Dovecot 2.3 to
2.4"): mail_driver/mail_path, typed settings at the top level,
`fts casidx { }`, `passdb static { }`, %{variables}. What it cannot
translate raises unittest.SkipTest naming the setting, so a test that
depends on a 2.3-only feature is reported as skipped, with the reason,
never as passed.
"""

import re
import sys
import unittest

# 2.3 %-variables the tests use, and their 2.4 names.
VARS = {
    "%u": "%{user}",
    "%n": "%{user|username}",
    "%d": "%{user|domain}",
    "%h": "%{home}",
    "%w": "%{password}",
    "%%": "%%",
}

# mail_location parameters -> 2.4 settings
LOCATION_PARAMS = {
    "INDEX": "mail_index_path",
    "CONTROL": "mail_control_path",
    "INBOX": "mail_inbox_path",
    "LAYOUT": "mailbox_list_layout",
    "VOLATILEDIR": "mail_volatile_path",
}

# 2.3 plugin {} keys that are top-level settings of the same name in 2.4
SAME_NAME = re.compile(r"^(casbox_[a-z0-9_]+|fts_autoindex)$")

# extra_conf lines (key = value, or block openings) that mean the same
# in 2.4; extra_conf() rewrites the few that changed
EXTRA_SAME = re.compile(r"^\s*(lmtp_add_received_header|mail_debug|"
                        r"mail_fsync|lock_method|recipient_delimiter|"
                        r"imap_metadata|doveadm_password|doveadm_port|"
                        r"port|special_use|mail_save_crlf|process_limit|"
                        r"mail_max_userip_connections|quota_full_tempfail)\s*=|"
                        r"^\s*(protocol \w+|service \w+|inet_listener"
                        r"( \w+)?|namespace \w+|mailbox \w+)\s*\{\s*$|"
                        r"^\s*\}\s*$")


def skip(reason):
    """Skip the running test on 2.4, the reason also on stderr (in the
    test's log whatever the runner's verbosity; scripts/test-all lists
    them)."""
    reason = "Dovecot 2.4: " + reason
    sys.stderr.write("skipped: %s\n" % reason)
    raise unittest.SkipTest(reason)


def vars24(value):
    value = re.sub(r"%[a-zA-Z%]", lambda m: VARS.get(m.group(0),
                                                     m.group(0)), value)
    if value.startswith("~/"):
        value = "%{home}/" + value[2:]
    return value


def mail_location(location):
    """'driver:path[:KEY=value...]' -> list of 2.4 setting lines."""
    parts = location.split(":")
    lines = ["mail_driver = %s" % parts[0]]
    if len(parts) > 1 and parts[1] != "":
        lines.append("mail_path = %s" % vars24(parts[1]))
    for param in parts[2:]:
        key, _, value = param.partition("=")
        if key not in LOCATION_PARAMS:
            skip("the harness does not "
                                    "translate mail_location parameter "
                                    "%s" % key)
        lines.append("%s = %s" % (LOCATION_PARAMS[key], vars24(value)))
    return lines


# 2.3 quota_rule resources -> 2.4 quota root settings
QUOTA_RULE_RESOURCES = {
    "storage": "quota_storage_size",
    "messages": "quota_message_count",
}


def quota_root(settings):
    """2.3's quota = count:NAME and quota_rule = *:RES=N -> a 2.4
    `quota "NAME" { }` block (lines). 2.4's count driver always counts
    virtual sizes (quota_vsizes is gone); the other 2.3 drivers used
    here (dict) were removed in 2.4."""
    driver, _, rest = settings["quota"].partition(":")
    name = rest.split(":")[0]
    if driver != "count":
        skip("quota driver %s was removed in 2.4" % driver)
    lines = ['quota "%s" {' % name, "  quota_driver = count"]
    rule = settings.get("quota_rule")
    if rule is not None:
        mailbox, _, limits = rule.partition(":")
        if mailbox != "*":
            skip("the harness does not translate quota_rule %r" % rule)
        for limit in limits.split(":"):
            res, _, value = limit.partition("=")
            if res not in QUOTA_RULE_RESOURCES:
                skip("the harness does not translate quota_rule %r"
                     % rule)
            lines.append("  %s = %s" % (QUOTA_RULE_RESOURCES[res], value))
    lines.append("}")
    return lines


def plugin_settings(settings):
    """The plugin {} dict -> (top-level lines, lines of fts casidx {})."""
    top, fts = [], []
    driver = settings.get("fts")
    if "quota" in settings:
        top += quota_root(settings)
    for key, value in sorted(settings.items()):
        value = vars24(str(value))
        if key in ("fts", "quota", "quota_rule", "quota_vsizes"):
            continue
        if key == "mail_replica":
            skip("the replicator was removed in 2.4 (doc/scaling.md: "
                 "cron'd doveadm sync)")
        if key.startswith("fts_casidx_"):
            fts.append("%s = %s" % (key, value))
        elif SAME_NAME.match(key):
            top.append("%s = %s" % (key, value))
        elif key == "lazy_expunge" and not value.endswith("/"):
            # 2.3's mailbox form (no namespace prefix)
            top.append("lazy_expunge_mailbox = %s" % value)
        elif key == "fts_enforced":
            # 2.3 yes/body: answer from the index only, never by
            # reading the mails
            if value in ("yes", "body"):
                top.append("fts_search_read_fallback = no")
        else:
            skip("the harness does not "
                                    "translate plugin setting %s" % key)
    if driver is not None and driver != "casidx":
        skip("fts = %s" % driver)
    return top, (fts if driver is not None else None)


def extra_conf(text):
    """The snippets the tests pass, in 2.4 syntax. Lines whose meaning is
    unchanged pass through, a few are rewritten; anything else is a
    2.3-only configuration (SkipTest)."""
    out = []
    for line in text.splitlines():
        if line.strip() == "" or line.lstrip().startswith("#"):
            continue
        m = re.match(r"^(\s*)address\s*=\s*(.*)$", line)
        if m is not None:
            out.append("%slisten = %s" % m.groups())
            continue
        m = re.match(r"^(\s*)inet_listener\s*\{\s*$", line)
        if m is not None:
            # 2.4 wants every listener named
            out.append("%sinet_listener extra%d {" % (m.group(1), len(out)))
            continue
        m = re.match(r"^(\s*)mail_plugins\s*=\s*\$mail_plugins\s+(.*)$",
                     line)
        if m is not None:
            # protocol { mail_plugins = $mail_plugins X }: 2.4 adds to
            # the global list in a block of booleans
            out.append("%smail_plugins {" % m.group(1))
            for plugin in m.group(2).split():
                out.append("%s  %s = yes" % (m.group(1), plugin))
            out.append("%s}" % m.group(1))
            continue
        m = re.match(r"^\s*mail_attribute_dict\s*=\s*file:(.*)$", line)
        if m is not None:
            out.append("mail_attribute {\n  dict file {\n    path = %s\n"
                       "  }\n}" % vars24(m.group(1)))
            continue
        if not EXTRA_SAME.match(line):
            skip("the harness does not "
                                    "translate %r" % line.strip())
        out.append(vars24(line))
    return "\n".join(out)


def passdb_fields(extra):
    """passdb_extra (2.3 override_fields = k=v ...) -> fields { }."""
    out = []
    for line in extra.splitlines():
        line = line.strip()
        if line == "":
            continue
        m = re.match(r"override_fields\s*=\s*(.*)$", line)
        if m is None:
            skip("the harness does not "
                                    "translate passdb line %r" % line)
        for field in m.group(1).split():
            key, _, value = field.partition("=")
            out.append("    %s = %s" % (key, vars24(value)))
    if not out:
        return ""
    return "  fields {\n%s\n  }\n" % "\n".join(out)


def userdb(dc):
    if dc.users is not None:
        return ("userdb passwd-file {\n  passwd_file_path = %s/users\n}"
                % dc.tmp)
    return ("userdb static {\n  fields {\n    uid = %d\n    gid = %d\n"
            "    home = %s/%%{user}\n  }\n  allow_all_users = yes\n}"
            % (dc.uid, dc.gid, dc.home_root))


def config_text(dc):
    t = dc.tmp
    top, fts = plugin_settings(dc.plugin_settings)
    plugins = "".join("  %s = yes\n" % p for p in dc.mail_plugins)
    fts_block = ""
    if fts is not None:
        fts_block = "fts casidx {\n%s}\n" % "".join(
            "  %s\n" % line for line in fts)
    if "fts" in dc.mail_plugins:
        # 2.4's fts plugin wants a language even for a backend that
        # tokenizes by itself
        fts_block += "language en {\n  default = yes\n}\n"
    lines = "\n".join(mail_location(dc.mail_location) + top)
    return f"""# generated by tests/e2e/dovecot_conf24.py (Dovecot 2.4)
dovecot_config_version = 2.4.1
dovecot_storage_version = 2.4.1
base_dir = {t}/run
state_dir = {t}/state
instance_name = casbox-test-{t.rsplit("/", 1)[-1]}
log_path = {dc.log_path}
listen = 127.0.0.1
protocols = {dc.protocols}
ssl = no
auth_allow_cleartext = yes
auth_mechanisms = plain
default_internal_user = {dc.internal_user}
default_login_user = {dc.login_user}
first_valid_uid = 1
mail_debug = {"yes" if dc.mail_debug else "no"}
stats_writer_socket_path =
mail_plugin_dir = {t}/modules
mail_plugins {{
{plugins}}}
{lines}
{fts_block}passdb static {{
  password = {dc_password()}
{passdb_fields(dc.passdb_extra)}}}
{userdb(dc)}
namespace inbox {{
  inbox = yes
  separator = /
  prefix =
}}
service imap-login {{
  inet_listener imap {{
    listen = 127.0.0.1
    port = {dc.imap_port}
  }}
  inet_listener imaps {{
    port = 0
  }}
  chroot =
}}
service lmtp {{
  inet_listener lmtp {{
    listen = 127.0.0.1
    port = {dc.lmtp_port}
  }}
}}
service anvil {{
  chroot =
}}
{dc.config_listener_text()}{extra_conf(dc.extra_conf)}
"""


def dc_password():
    from dovecot_harness import PASSWORD
    return PASSWORD
