/* s3: driver (libcurl, SigV4 by CURLOPT_AWS_SIGV4). Any S3-compatible
   service: path-style (https://host/bucket/key) or virtual-host style
   (https://bucket.host/key) URLs, TLS verified (ca_file= to add a CA),
   the payload's SHA-256 signed (x-amz-content-sha256), connect and
   stall timeouts from the spec, and up to three retries with backoff
   (0.2, 0.8, 3.2 s) on connection errors, 5xx and 429. Credentials come
   from a file: the access key id on the first line, the secret key on
   the second; neither is ever put in an error string. */

#include "lib.h"
#include "array.h"
#include "str.h"
#include "buffer.h"
#include "hex-binary.h"
#include "read-full.h"
#include "safe-memset.h"
#include "casbox-objstore.h"

#include <curl/curl.h>
#include <sodium.h>
#include <unistd.h>

#define CASBOX_S3_RETRIES 3
#define CASBOX_S3_BACKOFF_MSECS 200
#define CASBOX_S3_EMPTY_SHA256 \
	"e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
#define CASBOX_S3_ERROR_BODY_MAX 4096

struct casbox_objstore_s3 {
	const char *scheme_host;	/* https://host[:port] */
	const char *host;
	const char *bucket;
	const char *region;
	const char *ca_file;
	bool virtual_host;
	const char *userpwd;	/* access:secret, wiped at deinit */
	const char *sigv4;	/* aws:amz:<region>:s3 */
	CURL *curl;
};

struct casbox_s3_request {
	const char *method;
	const char *key;	/* NULL = the bucket */
	const char *query;	/* NULL or "list-type=2&..." */
	const char *range;	/* NULL or "bytes=a-b" */
	const char *payload_sha256;
	/* upload source */
	int in_fd;
	uint64_t in_size, in_pos;
	/* response body: into buf (ranged get) or into body */
	unsigned char *buf;
	size_t buf_size, buf_used;
	buffer_t *body;
	long status;
	curl_off_t content_length;
};

static bool casbox_s3_curl_initialized = FALSE;

static int
casbox_objstore_s3_credentials(struct casbox_objstore *os,
			       struct casbox_objstore_s3 *s3, const char *path,
			       const char **error_r)
{
	const char *secret, *const *lines;
	const char *error;

	if (casbox_objstore_read_secret(os->pool, path, &secret, &error) < 0) {
		*error_r = t_strdup_printf("casbox_pack_storage: s3: "
					   "credentials: %s", error);
		return -1;
	}
	lines = t_strsplit(secret, "\n");
	if (str_array_length(lines) != 2 || lines[0][0] == '\0' ||
	    lines[1][0] == '\0' || strchr(lines[0], ':') != NULL) {
		*error_r = t_strdup_printf("casbox_pack_storage: s3: %s: "
			"expected two lines, the access key id and the secret "
			"key", path);
		safe_memset((char *)secret, 0, strlen(secret));
		return -1;
	}
	s3->userpwd = p_strdup_printf(os->pool, "%s:%s", lines[0],
				      t_strcut(lines[1], '\r'));
	safe_memset((char *)secret, 0, strlen(secret));
	return 0;
}

static int
casbox_objstore_s3_parse_url(struct casbox_objstore_s3 *s3, pool_t pool,
			     const char *url, const char **error_r)
{
	const char *p, *hostpart;

	if (str_begins(url, "https://"))
		p = url + 8;
	else if (str_begins(url, "http://"))
		p = url + 7;
	else {
		*error_r = "casbox_pack_storage: s3: url= must begin with "
			"https:// (or http://)";
		return -1;
	}
	hostpart = t_strcut(p, '/');
	s3->scheme_host = p_strdup_until(pool, url, p + strlen(hostpart));
	s3->host = p_strdup(pool, hostpart);
	p += strlen(hostpart);
	if (*p == '/')
		p++;
	s3->bucket = p_strdup(pool, t_strcut(p, '/'));
	if (s3->bucket[0] == '\0') {
		*error_r = "casbox_pack_storage: s3: url= names no bucket "
			"(https://host/bucket)";
		return -1;
	}
	return 0;
}

static int
casbox_objstore_s3_init(struct casbox_objstore *os, const char *const *opts,
			const char **error_r)
{
	struct casbox_objstore_s3 *s3;
	const char *url = casbox_objstore_opt(opts, "url");
	const char *creds = casbox_objstore_opt(opts, "credentials");
	const char *style = casbox_objstore_opt(opts, "style");
	const char *region = casbox_objstore_opt(opts, "region");

	if (url == NULL || creds == NULL) {
		*error_r = "casbox_pack_storage: s3: url= and credentials= "
			"are required";
		return -1;
	}
	s3 = p_new(os->pool, struct casbox_objstore_s3, 1);
	if (casbox_objstore_s3_parse_url(s3, os->pool, url, error_r) < 0)
		return -1;
	if (style != NULL && strcmp(style, "virtual") != 0 &&
	    strcmp(style, "path") != 0) {
		*error_r = "casbox_pack_storage: s3: style= is path or virtual";
		return -1;
	}
	s3->virtual_host = style != NULL && strcmp(style, "virtual") == 0;
	s3->region = p_strdup(os->pool, region != NULL ? region : "us-east-1");
	s3->ca_file = p_strdup(os->pool, casbox_objstore_opt(opts, "ca_file"));
	s3->sigv4 = p_strdup_printf(os->pool, "aws:amz:%s:s3", s3->region);
	if (casbox_objstore_s3_credentials(os, s3, creds, error_r) < 0)
		return -1;
	if (!casbox_s3_curl_initialized) {
		if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK) {
			*error_r = "curl_global_init() failed";
			return -1;
		}
		casbox_s3_curl_initialized = TRUE;
	}
	os->context = s3;
	os->label = p_strdup_printf(os->pool, "s3:%s/%s", s3->scheme_host,
				    s3->bucket);
	return 0;
}

static void casbox_objstore_s3_deinit(struct casbox_objstore *os)
{
	struct casbox_objstore_s3 *s3 = os->context;

	if (s3->curl != NULL)
		curl_easy_cleanup(s3->curl);
	safe_memset((char *)s3->userpwd, 0, strlen(s3->userpwd));
}

static const char *
casbox_s3_url(struct casbox_objstore_s3 *s3, const char *key,
	      const char *query)
{
	string_t *url = t_str_new(128);
	const char *const *seg;

	if (s3->virtual_host) {
		const char *p = strstr(s3->scheme_host, "://") + 3;

		str_append_data(url, s3->scheme_host, p - s3->scheme_host);
		str_printfa(url, "%s.%s/", s3->bucket, p);
	} else {
		str_printfa(url, "%s/%s/", s3->scheme_host, s3->bucket);
	}
	if (key != NULL) {
		for (seg = t_strsplit(key, "/"); *seg != NULL; seg++) {
			char *esc = curl_easy_escape(NULL, *seg, 0);

			str_append(url, esc);
			curl_free(esc);
			if (seg[1] != NULL)
				str_append_c(url, '/');
		}
	}
	if (query != NULL)
		str_printfa(url, "?%s", query);
	return str_c(url);
}

static size_t casbox_s3_write(char *ptr, size_t size, size_t nmemb,
			      void *context)
{
	struct casbox_s3_request *req = context;
	size_t n = size * nmemb;

	if (req->buf != NULL && req->status / 100 == 2) {
		if (n > req->buf_size - req->buf_used)
			return 0; /* more than asked for: fail the transfer */
		memcpy(req->buf + req->buf_used, ptr, n);
		req->buf_used += n;
		return n;
	}
	if (req->body->used + n <= CASBOX_S3_ERROR_BODY_MAX ||
	    req->buf == NULL)
		buffer_append(req->body, ptr, n);
	return n;
}

static size_t casbox_s3_header(char *ptr, size_t size, size_t nmemb,
			       void *context)
{
	struct casbox_s3_request *req = context;

	/* the status line comes first: writes see the right status */
	if (size * nmemb > 5 && memcmp(ptr, "HTTP/", 5) == 0) {
		const char *sp = memchr(ptr, ' ', size * nmemb);

		if (sp != NULL)
			req->status = strtol(sp + 1, NULL, 10);
	}
	return size * nmemb;
}

static size_t casbox_s3_read(char *ptr, size_t size, size_t nmemb,
			     void *context)
{
	struct casbox_s3_request *req = context;
	size_t n = I_MIN(size * nmemb, req->in_size - req->in_pos);
	ssize_t ret;

	if (n == 0)
		return 0;
	ret = pread(req->in_fd, ptr, n, req->in_pos);
	if (ret <= 0)
		return CURL_READFUNC_ABORT;
	req->in_pos += ret;
	return ret;
}

static CURL *casbox_s3_handle(struct casbox_objstore *os)
{
	struct casbox_objstore_s3 *s3 = os->context;

	if (s3->curl == NULL) {
		s3->curl = curl_easy_init();
		if (s3->curl == NULL)
			i_fatal_status(FATAL_OUTOFMEM, "curl_easy_init() failed");
	} else {
		/* keeps the connection */
		curl_easy_reset(s3->curl);
	}
	return s3->curl;
}

/* The S3 error code of a response body, or the status. */
static const char *casbox_s3_error(struct casbox_s3_request *req)
{
	const char *body = t_strndup(req->body->data, req->body->used);
	const char *p = strstr(body, "<Code>"), *end;

	if (p != NULL && (end = strstr(p, "</Code>")) != NULL) {
		return t_strdup_printf("HTTP %ld %s", req->status,
				       t_strdup_until(p + 6, end));
	}
	return t_strdup_printf("HTTP %ld", req->status);
}

static int casbox_s3_perform_once(struct casbox_objstore *os,
				  struct casbox_s3_request *req,
				  const char **error_r)
{
	struct casbox_objstore_s3 *s3 = os->context;
	struct curl_slist *headers = NULL;
	CURL *curl = casbox_s3_handle(os);
	char errbuf[CURL_ERROR_SIZE] = "";
	CURLcode code;

	headers = curl_slist_append(headers, t_strdup_printf(
		"x-amz-content-sha256: %s", req->payload_sha256 != NULL ?
		req->payload_sha256 : CASBOX_S3_EMPTY_SHA256));
	if (req->range != NULL) {
		headers = curl_slist_append(headers,
			t_strdup_printf("Range: %s", req->range));
	}
	/* not "Expect:" (to skip 100-continue): curl 7.88 signs the empty
	   header it then does not send, and the signature fails */
	curl_easy_setopt(curl, CURLOPT_URL,
			 casbox_s3_url(s3, req->key, req->query));
	curl_easy_setopt(curl, CURLOPT_HTTPHEADER, headers);
	curl_easy_setopt(curl, CURLOPT_AWS_SIGV4, s3->sigv4);
	curl_easy_setopt(curl, CURLOPT_USERPWD, s3->userpwd);
	curl_easy_setopt(curl, CURLOPT_NOSIGNAL, 1L);
	curl_easy_setopt(curl, CURLOPT_ERRORBUFFER, errbuf);
	curl_easy_setopt(curl, CURLOPT_CONNECTTIMEOUT_MS,
			 (long)os->timeout_msecs);
	/* a stalled transfer, not a long one, is a timeout */
	curl_easy_setopt(curl, CURLOPT_LOW_SPEED_LIMIT, 1L);
	curl_easy_setopt(curl, CURLOPT_LOW_SPEED_TIME,
			 (long)(os->timeout_msecs + 999) / 1000);
	curl_easy_setopt(curl, CURLOPT_PROTOCOLS_STR, "http,https");
	if (s3->ca_file != NULL)
		curl_easy_setopt(curl, CURLOPT_CAINFO, s3->ca_file);
	curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, casbox_s3_write);
	curl_easy_setopt(curl, CURLOPT_WRITEDATA, req);
	curl_easy_setopt(curl, CURLOPT_HEADERFUNCTION, casbox_s3_header);
	curl_easy_setopt(curl, CURLOPT_HEADERDATA, req);
	if (strcmp(req->method, "PUT") == 0) {
		curl_easy_setopt(curl, CURLOPT_UPLOAD, 1L);
		curl_easy_setopt(curl, CURLOPT_INFILESIZE_LARGE,
				 (curl_off_t)req->in_size);
		curl_easy_setopt(curl, CURLOPT_READFUNCTION, casbox_s3_read);
		curl_easy_setopt(curl, CURLOPT_READDATA, req);
	} else if (strcmp(req->method, "HEAD") == 0) {
		curl_easy_setopt(curl, CURLOPT_NOBODY, 1L);
	} else if (strcmp(req->method, "GET") != 0) {
		curl_easy_setopt(curl, CURLOPT_CUSTOMREQUEST, req->method);
	}
	req->status = 0;
	req->in_pos = 0;
	req->buf_used = 0;
	buffer_set_used_size(req->body, 0);
	code = curl_easy_perform(curl);
	curl_slist_free_all(headers);
	if (code != CURLE_OK) {
		*error_r = t_strdup_printf("%s: %s", curl_easy_strerror(code),
					   errbuf);
		return -1;
	}
	curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &req->status);
	curl_easy_getinfo(curl, CURLINFO_CONTENT_LENGTH_DOWNLOAD_T,
			  &req->content_length);
	return 0;
}

/* Returns 0 with req->status set, -1 transport error after retries. */
static int casbox_s3_perform(struct casbox_objstore *os,
			     struct casbox_s3_request *req,
			     const char **error_r)
{
	unsigned int try, delay = CASBOX_S3_BACKOFF_MSECS;
	int ret;

	if (req->body == NULL)
		req->body = t_buffer_create(256);
	for (try = 0;; try++) {
		ret = casbox_s3_perform_once(os, req, error_r);
		if (ret == 0 && req->status != 429 && req->status / 100 != 5)
			return 0;
		if (ret == 0)
			*error_r = casbox_s3_error(req);
		if (try == CASBOX_S3_RETRIES)
			return -1;
		/* bounded: 0.2 + 0.8 + 3.2 s at most */
		usleep(delay * 1000);
		delay *= 4;
	}
}

static int casbox_s3_sha256_fd(int fd, uint64_t size, char hex_r[65],
			       const char **error_r)
{
	crypto_hash_sha256_state state;
	unsigned char digest[crypto_hash_sha256_BYTES];
	unsigned char *buf = i_malloc(1024 * 1024);
	uint64_t off = 0;
	int ret = 0;

	crypto_hash_sha256_init(&state);
	while (off < size) {
		size_t n = I_MIN(size - off, 1024 * 1024);

		if (pread_full(fd, buf, n, off) <= 0) {
			*error_r = t_strdup_printf("read of the pack failed: %m");
			ret = -1;
			break;
		}
		crypto_hash_sha256_update(&state, buf, n);
		off += n;
	}
	crypto_hash_sha256_final(&state, digest);
	i_free(buf);
	memcpy(hex_r, binary_to_hex(digest, sizeof(digest)), 64);
	hex_r[64] = '\0';
	return ret;
}

static int
casbox_objstore_s3_put(struct casbox_objstore *os, const char *name, int fd,
		       uint64_t size, const char **error_r)
{
	struct casbox_s3_request req;
	char sha[65];

	if (casbox_s3_sha256_fd(fd, size, sha, error_r) < 0)
		return -1;
	i_zero(&req);
	req.method = "PUT";
	req.key = name;
	req.payload_sha256 = sha;
	req.in_fd = fd;
	req.in_size = size;
	if (casbox_s3_perform(os, &req, error_r) < 0)
		return -1;
	if (req.status / 100 != 2) {
		*error_r = casbox_s3_error(&req);
		return -1;
	}
	return 1;
}

/* 404: the object, or the bucket (an error: a missing bucket is a
   setting to fix, not an empty store). */
static int casbox_s3_not_found(struct casbox_s3_request *req,
			       const char **error_r)
{
	if (strstr(t_strndup(req->body->data, req->body->used),
		   "NoSuchBucket") != NULL) {
		*error_r = "HTTP 404 NoSuchBucket (the bucket does not exist)";
		return -1;
	}
	return 0;
}

static int
casbox_objstore_s3_get(struct casbox_objstore *os, const char *name,
		       uint64_t offset, void *buf, size_t size,
		       size_t *read_r, const char **error_r)
{
	struct casbox_s3_request req;

	if (size == 0) {
		*read_r = 0;
		return 1;
	}
	i_zero(&req);
	req.method = "GET";
	req.key = name;
	req.range = t_strdup_printf("bytes=%"PRIu64"-%"PRIu64, offset,
				    offset + size - 1);
	req.buf = buf;
	req.buf_size = size;
	if (casbox_s3_perform(os, &req, error_r) < 0)
		return -1;
	if (req.status == 404)
		return casbox_s3_not_found(&req, error_r);
	if (req.status == 416) {
		/* the range starts past the end */
		*read_r = 0;
		return 1;
	}
	if (req.status != 206 && !(req.status == 200 && offset == 0)) {
		*error_r = casbox_s3_error(&req);
		return -1;
	}
	*read_r = req.buf_used;
	return 1;
}

static int
casbox_objstore_s3_stat(struct casbox_objstore *os, const char *name,
			uint64_t *size_r, const char **error_r)
{
	struct casbox_s3_request req;

	i_zero(&req);
	req.method = "HEAD";
	req.key = name;
	if (casbox_s3_perform(os, &req, error_r) < 0)
		return -1;
	if (req.status == 404)
		return 0;
	if (req.status != 200 || req.content_length < 0) {
		*error_r = casbox_s3_error(&req);
		return -1;
	}
	*size_r = req.content_length;
	return 1;
}

static const char *casbox_s3_xml_unescape(const char *s)
{
	string_t *str;

	if (strchr(s, '&') == NULL)
		return s;
	str = t_str_new(strlen(s));
	while (*s != '\0') {
		if (str_begins(s, "&amp;")) {
			str_append_c(str, '&'); s += 5;
		} else if (str_begins(s, "&lt;")) {
			str_append_c(str, '<'); s += 4;
		} else if (str_begins(s, "&gt;")) {
			str_append_c(str, '>'); s += 4;
		} else if (str_begins(s, "&quot;")) {
			str_append_c(str, '"'); s += 6;
		} else if (str_begins(s, "&apos;")) {
			str_append_c(str, '\''); s += 6;
		} else {
			str_append_c(str, *s++);
		}
	}
	return str_c(str);
}

/* <Key>s into names; *token_r = NextContinuationToken or NULL. */
static void
casbox_s3_list_parse(const char *xml, pool_t pool,
		     ARRAY_TYPE(const_string) *names, const char **token_r)
{
	const char *p = xml, *end, *name;

	while ((p = strstr(p, "<Key>")) != NULL &&
	       (end = strstr(p, "</Key>")) != NULL) {
		name = p_strdup(pool, casbox_s3_xml_unescape(
			t_strdup_until(p + 5, end)));
		array_push_back(names, &name);
		p = end;
	}
	*token_r = NULL;
	if (strstr(xml, "<IsTruncated>true</IsTruncated>") != NULL &&
	    (p = strstr(xml, "<NextContinuationToken>")) != NULL &&
	    (end = strstr(p, "</NextContinuationToken>")) != NULL) {
		*token_r = casbox_s3_xml_unescape(
			t_strdup_until(p + 23, end));
	}
}

static int
casbox_objstore_s3_list(struct casbox_objstore *os, const char *prefix,
			pool_t pool, ARRAY_TYPE(const_string) *names,
			const char **error_r)
{
	struct casbox_s3_request req;
	const char *token = NULL;
	char *esc;

	do {
		i_zero(&req);
		req.method = "GET";
		req.body = t_buffer_create(4096);
		esc = curl_easy_escape(NULL, prefix, 0);
		req.query = t_strdup_printf("list-type=2&prefix=%s", esc);
		curl_free(esc);
		if (token != NULL) {
			esc = curl_easy_escape(NULL, token, 0);
			req.query = t_strdup_printf(
				"continuation-token=%s&%s", esc, req.query);
			curl_free(esc);
		}
		if (casbox_s3_perform(os, &req, error_r) < 0)
			return -1;
		if (req.status != 200) {
			*error_r = casbox_s3_error(&req);
			return -1;
		}
		casbox_s3_list_parse(t_strndup(req.body->data, req.body->used),
				     pool, names, &token);
	} while (token != NULL);
	return 0;
}

static int
casbox_objstore_s3_delete(struct casbox_objstore *os, const char *name,
			  const char **error_r)
{
	struct casbox_s3_request req;

	i_zero(&req);
	req.method = "DELETE";
	req.key = name;
	if (casbox_s3_perform(os, &req, error_r) < 0)
		return -1;
	if (req.status == 404)
		return casbox_s3_not_found(&req, error_r);
	if (req.status / 100 != 2) {
		*error_r = casbox_s3_error(&req);
		return -1;
	}
	return 1;
}

const struct casbox_objstore_vfuncs casbox_objstore_s3 = {
	.name = "s3",
	.init = casbox_objstore_s3_init,
	.deinit = casbox_objstore_s3_deinit,
	.put = casbox_objstore_s3_put,
	.get = casbox_objstore_s3_get,
	.stat = casbox_objstore_s3_stat,
	.list = casbox_objstore_s3_list,
	.delete = casbox_objstore_s3_delete,
};
