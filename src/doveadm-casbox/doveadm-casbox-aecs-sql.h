#ifndef DOVEADM_CASBOX_AECS_SQL_H
#define DOVEADM_CASBOX_AECS_SQL_H

/* The export's own statements (bookkeeping tables and the deletes of
   incremental runs); the inserts are the named queries of
   sqlite-queries.sql. Tables with the casbox_ prefix are ours, the
   rest is the AECS schema. See doc/aecs.md, "Bookkeeping". */

/* One row per exported mailbox: the sync cursor. */
#define AECS_SQL_CURSOR_DDL \
	"CREATE TABLE IF NOT EXISTS casbox_aecs_cursor (\n" \
	"  mailbox_id     TEXT    NOT NULL,\n" \
	"  mailbox        TEXT    NOT NULL,\n" \
	"  uidvalidity    INTEGER NOT NULL,\n" \
	"  highest_modseq INTEGER NOT NULL,\n" \
	"  PRIMARY KEY (mailbox_id, mailbox)\n" \
	");"
/* One row per message in a folder (a message row may have several). */
#define AECS_SQL_SOURCE_DDL \
	"CREATE TABLE IF NOT EXISTS casbox_aecs_source (\n" \
	"  mailbox_id  TEXT    NOT NULL,\n" \
	"  mailbox     TEXT    NOT NULL,\n" \
	"  uid         INTEGER NOT NULL,\n" \
	"  uidvalidity INTEGER NOT NULL,\n" \
	"  message_key TEXT    NOT NULL,\n" \
	"  guid        TEXT    NOT NULL,\n" \
	"  size        INTEGER NOT NULL,\n" \
	"  flags       TEXT    NOT NULL,\n" \
	"  keywords    TEXT    NOT NULL,\n" \
	"  PRIMARY KEY (mailbox_id, mailbox, uid)\n" \
	");"
#define AECS_SQL_SOURCE_KEY_DDL \
	"CREATE INDEX IF NOT EXISTS casbox_aecs_source_key " \
	"ON casbox_aecs_source (mailbox_id, message_key);"

#define AECS_SQL_CURSOR_GET \
	"SELECT uidvalidity, highest_modseq FROM casbox_aecs_cursor " \
	"WHERE mailbox_id = ?1 AND mailbox = ?2"
#define AECS_SQL_CURSOR_SET \
	"INSERT INTO casbox_aecs_cursor " \
	"(mailbox_id, mailbox, uidvalidity, highest_modseq) " \
	"VALUES (?1, ?2, ?3, ?4) ON CONFLICT (mailbox_id, mailbox) " \
	"DO UPDATE SET uidvalidity = excluded.uidvalidity, " \
	"highest_modseq = excluded.highest_modseq"
#define AECS_SQL_CURSOR_DELETE \
	"DELETE FROM casbox_aecs_cursor WHERE mailbox_id = ?1 AND mailbox = ?2"
#define AECS_SQL_CURSOR_LIST \
	"SELECT mailbox FROM casbox_aecs_cursor WHERE mailbox_id = ?1"

#define AECS_SQL_SOURCE_LIST \
	"SELECT uid, message_key, flags, keywords FROM casbox_aecs_source " \
	"WHERE mailbox_id = ?1 AND mailbox = ?2"
#define AECS_SQL_SOURCE_ADD \
	"INSERT INTO casbox_aecs_source (mailbox_id, mailbox, uid, " \
	"uidvalidity, message_key, guid, size, flags, keywords) " \
	"VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)"
#define AECS_SQL_SOURCE_FLAGS \
	"UPDATE casbox_aecs_source SET flags = ?4, keywords = ?5 " \
	"WHERE mailbox_id = ?1 AND mailbox = ?2 AND uid = ?3"
#define AECS_SQL_SOURCE_DELETE \
	"DELETE FROM casbox_aecs_source " \
	"WHERE mailbox_id = ?1 AND mailbox = ?2 AND uid = ?3"
#define AECS_SQL_SOURCE_OF_KEY \
	"SELECT mailbox, uidvalidity, uid, guid, size, flags, keywords " \
	"FROM casbox_aecs_source WHERE mailbox_id = ?1 AND message_key = ?2 " \
	"ORDER BY mailbox, uid"

#define AECS_SQL_MESSAGE_THREAD \
	"SELECT thread_id, thread_key FROM aecs_messages " \
	"WHERE mailbox_id = ?1 AND message_key = ?2"
#define AECS_SQL_MESSAGE_XFIELDS \
	"UPDATE aecs_messages SET x_fields = ?3 " \
	"WHERE mailbox_id = ?1 AND message_key = ?2 " \
	"AND x_fields IS NOT ?3"

#define AECS_SQL_KEY_WHERE "WHERE mailbox_id = ?1 AND message_key = ?2"
#define AECS_SQL_DELETE_SEARCH \
	"DELETE FROM aecs_search WHERE rowid IN (SELECT rowid FROM " \
	"aecs_messages " AECS_SQL_KEY_WHERE ")"
#define AECS_SQL_DELETE_BODY "DELETE FROM aecs_bodies " AECS_SQL_KEY_WHERE
#define AECS_SQL_DELETE_ADDRESSES \
	"DELETE FROM aecs_addresses " AECS_SQL_KEY_WHERE
#define AECS_SQL_DELETE_REFERENCES \
	"DELETE FROM aecs_references " AECS_SQL_KEY_WHERE
#define AECS_SQL_DELETE_ATTACHMENTS \
	"DELETE FROM aecs_attachments " AECS_SQL_KEY_WHERE
#define AECS_SQL_DELETE_MESSAGE "DELETE FROM aecs_messages " AECS_SQL_KEY_WHERE

/* After a message of thread ?2 is gone: its counts and ends again. */
#define AECS_SQL_THREAD_OF "FROM aecs_messages WHERE mailbox_id = ?1 " \
	"AND thread_key = ?2"
#define AECS_SQL_THREAD_RECOUNT \
	"UPDATE aecs_threads SET " \
	"message_count = (SELECT COUNT(*) " AECS_SQL_THREAD_OF "), " \
	"first_ts = COALESCE((SELECT MIN(ts) " AECS_SQL_THREAD_OF \
	"), first_ts), " \
	"last_ts = COALESCE((SELECT MAX(ts) " AECS_SQL_THREAD_OF \
	"), last_ts), " \
	"last_message_key = COALESCE((SELECT message_key " \
	AECS_SQL_THREAD_OF " ORDER BY ts DESC, message_key DESC LIMIT 1), " \
	"last_message_key), " \
	"subject = (SELECT subject " AECS_SQL_THREAD_OF \
	" ORDER BY ts, message_key LIMIT 1) " \
	"WHERE mailbox_id = ?1 AND thread_key = ?2"
#define AECS_SQL_THREAD_DROP_EMPTY \
	"DELETE FROM aecs_threads WHERE mailbox_id = ?1 " \
	"AND thread_key = ?2 AND message_count = 0"

#endif
