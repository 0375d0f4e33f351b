/* SPDX-License-Identifier: BSD-3-Clause */
/* GET /metrics over libmicrohttpd, rendered on the daemon's control thread (metrics.h). */
#include "metrics.h"

#include <arpa/inet.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "log.h"

#ifdef PBOX_HAVE_MHD
#include <microhttpd.h>

/* A scrape waits this long for the control thread's new rendering. */
#define RENDER_WAIT_MS 1000u
/* A rendering younger than this is served as it is: however fast clients scrape, the
 * control thread renders at most a few times a second. */
#define RENDER_REUSE_MS 250u
/* Request headers beyond this are refused by libmicrohttpd (431). */
#define CONN_MEMORY 8192u
/* How often the sweeper looks for connections past their deadline. */
#define SWEEP_MS 200u

/* One open connection: a dup of its socket, so the sweeper can shut it down without
 * racing libmicrohttpd's close of the original descriptor. */
struct mconn {
	int fd;
	uint64_t deadline_ms;
	struct mconn *next, **prev;
};

struct pbox_metrics {
	struct MHD_Daemon *mhd;
	int efd;
	uint16_t port;
	uint32_t timeout_s;
	uint32_t max_bytes;
	char daemon[32];
	pthread_mutex_t lock; /* everything below */
	pthread_cond_t rendered;
	char *text; /* last rendering (NULL: none yet) */
	size_t len;
	uint64_t generation;
	uint64_t rendered_ms;
	struct mconn *conns;
	pthread_t sweeper;
	bool sweeper_started, stop;
	pthread_cond_t stop_cond;
	/* counters (under lock) */
	uint64_t served, not_found, bad_method, stale, cut, failed;
};

static uint64_t mono_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

static enum MHD_Result reply(struct MHD_Connection *c, unsigned code, const char *body, size_t len,
			     bool free_body, const char *allow)
{
	struct MHD_Response *r = MHD_create_response_from_buffer(
		len, (void *)body, free_body ? MHD_RESPMEM_MUST_FREE : MHD_RESPMEM_PERSISTENT);
	enum MHD_Result ret;

	if (r == NULL) {
		if (free_body) {
			free((void *)body);
		}
		return MHD_NO;
	}
	MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE,
				code == MHD_HTTP_OK ? "text/plain; version=0.0.4; charset=utf-8"
						    : "text/plain; charset=utf-8");
	if (allow != NULL) {
		MHD_add_response_header(r, MHD_HTTP_HEADER_ALLOW, allow);
	}
	ret = MHD_queue_response(c, code, r);
	MHD_destroy_response(r);
	return ret;
}

/* Ask the control thread for a rendering and wait for it (bounded); the text to send, with
 * the age gauge appended (malloc'd), or NULL. */
static char *fresh_text(struct pbox_metrics *m, size_t *len)
{
	uint64_t gen, one = 1, now;
	struct timespec until;
	char *out = NULL, tail[256];
	int n;

	pthread_mutex_lock(&m->lock);
	gen = m->generation;
	if (m->text != NULL && mono_ms() - m->rendered_ms < RENDER_REUSE_MS) {
		goto copy;
	}
	if (write(m->efd, &one, sizeof(one)) < 0) {
		/* EAGAIN: the counter is full, a rendering is already asked for. */
	}
	clock_gettime(CLOCK_REALTIME, &until);
	until.tv_sec += RENDER_WAIT_MS / 1000;
	until.tv_nsec += (long)(RENDER_WAIT_MS % 1000) * 1000000;
	if (until.tv_nsec >= 1000000000) {
		until.tv_sec++;
		until.tv_nsec -= 1000000000;
	}
	while (m->generation == gen && !m->stop) {
		if (pthread_cond_timedwait(&m->rendered, &m->lock, &until) == ETIMEDOUT) {
			m->stale++;
			break;
		}
	}
copy:
	if (m->text != NULL) {
		now = mono_ms();
		n = snprintf(tail, sizeof(tail),
			     "# HELP pbox_metrics_age_seconds Age of this rendering (the daemon's "
			     "control thread renders on demand)\n"
			     "# TYPE pbox_metrics_age_seconds gauge\n"
			     "pbox_metrics_age_seconds %.3f\n",
			     (double)(now - m->rendered_ms) / 1000.0);
		out = malloc(m->len + (size_t)n + 1);
		if (out != NULL) {
			memcpy(out, m->text, m->len);
			memcpy(out + m->len, tail, (size_t)n + 1);
			*len = m->len + (size_t)n;
		}
	}
	pthread_mutex_unlock(&m->lock);
	return out;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url,
				  const char *method, const char *version, const char *upload_data,
				  size_t *upload_data_size, void **req_cls)
{
	static const char nf[] = "not found: only /metrics is served\n";
	static const char bm[] = "method not allowed: GET /metrics\n";
	static const char na[] = "metrics not rendered yet\n";
	struct pbox_metrics *m = cls;
	bool head = strcmp(method, MHD_HTTP_METHOD_HEAD) == 0;
	size_t len = 0;
	char *text;

	(void)version;
	(void)upload_data;
	(void)req_cls;
	/* Answered at the first call, before any body is read (libmicrohttpd then closes the
	 * connection instead of reading a body nobody wants). */
	*upload_data_size = 0;
	if (strcmp(method, MHD_HTTP_METHOD_GET) != 0 && !head) {
		pthread_mutex_lock(&m->lock);
		m->bad_method++;
		pthread_mutex_unlock(&m->lock);
		return reply(c, MHD_HTTP_METHOD_NOT_ALLOWED, bm, sizeof(bm) - 1, false,
			     "GET, HEAD");
	}
	if (strcmp(url, "/metrics") != 0) {
		pthread_mutex_lock(&m->lock);
		m->not_found++;
		pthread_mutex_unlock(&m->lock);
		return reply(c, MHD_HTTP_NOT_FOUND, nf, sizeof(nf) - 1, false, NULL);
	}
	text = fresh_text(m, &len);
	if (text == NULL) {
		pthread_mutex_lock(&m->lock);
		m->failed++;
		pthread_mutex_unlock(&m->lock);
		return reply(c, MHD_HTTP_SERVICE_UNAVAILABLE, na, sizeof(na) - 1, false, NULL);
	}
	pthread_mutex_lock(&m->lock);
	m->served++;
	pthread_mutex_unlock(&m->lock);
	return reply(c, MHD_HTTP_OK, text, len, true, NULL);
}

/* Track every connection with a deadline (started) and forget it (closed). */
static void on_connection(void *cls, struct MHD_Connection *c, void **socket_context,
			  enum MHD_ConnectionNotificationCode code)
{
	struct pbox_metrics *m = cls;
	struct mconn *mc;

	if (code == MHD_CONNECTION_NOTIFY_STARTED) {
		const union MHD_ConnectionInfo *ci =
			MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);

		*socket_context = NULL;
		mc = calloc(1, sizeof(*mc));
		if (ci == NULL || mc == NULL) {
			free(mc);
			return;
		}
		mc->fd = dup(ci->connect_fd);
		if (mc->fd < 0) {
			free(mc);
			return;
		}
		mc->deadline_ms = mono_ms() + (uint64_t)m->timeout_s * 1000;
		pthread_mutex_lock(&m->lock);
		mc->next = m->conns;
		mc->prev = &m->conns;
		if (m->conns != NULL) {
			m->conns->prev = &mc->next;
		}
		m->conns = mc;
		pthread_mutex_unlock(&m->lock);
		*socket_context = mc;
		return;
	}
	mc = *socket_context;
	if (mc == NULL) {
		return;
	}
	pthread_mutex_lock(&m->lock);
	*mc->prev = mc->next;
	if (mc->next != NULL) {
		mc->next->prev = mc->prev;
	}
	pthread_mutex_unlock(&m->lock);
	close(mc->fd);
	free(mc);
	*socket_context = NULL;
}

/* libmicrohttpd's timeout counts inactivity only: a client that sends a byte now and then
 * (slowloris) would hold its connection for ever. The sweeper shuts down every connection
 * older than `timeout` seconds, whatever it is doing. */
static void *sweeper_main(void *arg)
{
	struct pbox_metrics *m = arg;

	pthread_mutex_lock(&m->lock);
	while (!m->stop) {
		struct timespec until;
		uint64_t now = mono_ms();

		for (struct mconn *mc = m->conns; mc != NULL; mc = mc->next) {
			if (mc->deadline_ms != 0 && now >= mc->deadline_ms) {
				shutdown(mc->fd, SHUT_RDWR);
				mc->deadline_ms = 0; /* once */
				m->cut++;
			}
		}
		clock_gettime(CLOCK_REALTIME, &until);
		until.tv_nsec += (long)SWEEP_MS * 1000000;
		if (until.tv_nsec >= 1000000000) {
			until.tv_sec++;
			until.tv_nsec -= 1000000000;
		}
		pthread_cond_timedwait(&m->stop_cond, &m->lock, &until);
	}
	pthread_mutex_unlock(&m->lock);
	return NULL;
}

/* libmicrohttpd's messages (mostly about clients: bad requests, oversized headers), at
 * most LOG_BURST lines per LOG_WINDOW_MS so that clients cannot flood the daemon's log. */
#define LOG_BURST     10u
#define LOG_WINDOW_MS 10000u

static void mhd_log(void *cls, const char *fmt, va_list ap)
{
	static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
	static uint64_t window_ms, left_out;
	static uint32_t n_in_window;
	uint64_t now = mono_ms(), skipped = 0;
	char msg[512];
	size_t n;

	pthread_mutex_lock(&lock);
	if (now - window_ms >= LOG_WINDOW_MS) {
		window_ms = now;
		n_in_window = 0;
	}
	if (n_in_window >= LOG_BURST) {
		left_out++;
		pthread_mutex_unlock(&lock);
		return;
	}
	n_in_window++;
	skipped = left_out;
	left_out = 0;
	pthread_mutex_unlock(&lock);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	n = strlen(msg);
	while (n > 0 && msg[n - 1] == '\n') {
		msg[--n] = '\0';
	}
	PBOX_LOG_WARN(ADMIN, "metrics %s: %s%s", (const char *)cls, msg,
		      skipped ? " (similar messages left out)" : "");
}

struct pbox_metrics *pbox_metrics_start(const struct pbox_metrics_cfg *cfg, const char *daemon)
{
	struct pbox_metrics *m = calloc(1, sizeof(*m));
	struct sockaddr_in sa = { .sin_family = AF_INET, .sin_port = htons(cfg->port) };
	const union MHD_DaemonInfo *di;

	if (m == NULL) {
		PBOX_LOG_ERR(ADMIN, "metrics: out of memory");
		return NULL;
	}
	snprintf(m->daemon, sizeof(m->daemon), "%s", daemon);
	m->timeout_s = cfg->timeout_s;
	m->max_bytes = cfg->max_bytes;
	pthread_mutex_init(&m->lock, NULL);
	pthread_cond_init(&m->rendered, NULL);
	pthread_cond_init(&m->stop_cond, NULL);
	m->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	if (m->efd < 0 || inet_pton(AF_INET, cfg->host, &sa.sin_addr) != 1) {
		PBOX_LOG_ERR(ADMIN, "metrics %s:%u: %s", cfg->host, cfg->port,
			     m->efd < 0 ? strerror(errno) : "not a numeric IPv4 address");
		goto fail;
	}
	if (pthread_create(&m->sweeper, NULL, sweeper_main, m) != 0) {
		PBOX_LOG_ERR(ADMIN, "metrics: cannot start its sweeper thread");
		goto fail;
	}
	m->sweeper_started = true;
	m->mhd = MHD_start_daemon(MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD |
					  MHD_USE_POLL | MHD_USE_ERROR_LOG,
				  cfg->port, NULL, NULL, on_request, m, MHD_OPTION_EXTERNAL_LOGGER,
				  mhd_log, m->daemon, MHD_OPTION_SOCK_ADDR, &sa,
				  MHD_OPTION_CONNECTION_LIMIT, (unsigned)cfg->max_connections,
				  MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)cfg->timeout_s,
				  MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t)CONN_MEMORY,
				  MHD_OPTION_NOTIFY_CONNECTION, on_connection, m, MHD_OPTION_END);
	if (m->mhd == NULL) {
		PBOX_LOG_ERR(ADMIN,
			     "metrics: cannot listen on %s:%u (address in use, or not an "
			     "address of this host?)",
			     cfg->host, cfg->port);
		goto fail;
	}
	di = MHD_get_daemon_info(m->mhd, MHD_DAEMON_INFO_BIND_PORT);
	m->port = di != NULL ? di->port : cfg->port;
	PBOX_LOG_INFO(ADMIN,
		      "metrics on http://%s:%u/metrics (%u connections at most, %u s each, "
		      "responses <= %u bytes)",
		      cfg->host, m->port, cfg->max_connections, cfg->timeout_s, cfg->max_bytes);
	return m;
fail:
	pbox_metrics_stop(m);
	return NULL;
}

void pbox_metrics_stop(struct pbox_metrics *m)
{
	if (m == NULL) {
		return;
	}
	pthread_mutex_lock(&m->lock);
	m->stop = true;
	pthread_cond_broadcast(&m->rendered);
	pthread_cond_broadcast(&m->stop_cond);
	pthread_mutex_unlock(&m->lock);
	if (m->mhd != NULL) {
		MHD_stop_daemon(m->mhd); /* joins the connections' threads */
	}
	if (m->sweeper_started) {
		pthread_join(m->sweeper, NULL);
	}
	if (m->efd >= 0) {
		close(m->efd);
	}
	pthread_cond_destroy(&m->rendered);
	pthread_cond_destroy(&m->stop_cond);
	pthread_mutex_destroy(&m->lock);
	free(m->text);
	free(m);
}

int pbox_metrics_fd(const struct pbox_metrics *m)
{
	return m->efd;
}

uint16_t pbox_metrics_port(const struct pbox_metrics *m)
{
	return m->port;
}

void pbox_metrics_serve(struct pbox_metrics *m, pbox_metrics_render_fn *fn, void *arg)
{
	uint64_t v, served, nf, bm, stale, cut, failed;
	struct pbox_prom p;
	const char *text;
	char *copy;

	if (read(m->efd, &v, sizeof(v)) < 0 && errno == EAGAIN) {
		return; /* nothing asked */
	}
	if (pbox_prom_init(&p, m->max_bytes) != 0) {
		PBOX_LOG_WARN(ADMIN, "metrics: out of memory rendering");
		return;
	}
	fn(arg, &p);
	pthread_mutex_lock(&m->lock);
	served = m->served;
	nf = m->not_found;
	bm = m->bad_method;
	stale = m->stale;
	cut = m->cut;
	failed = m->failed;
	pthread_mutex_unlock(&m->lock);
	pbox_prom_family(&p, "pbox_metrics_requests_total", "counter",
			 "HTTP requests of the metrics endpoint by outcome");
	pbox_prom_u64(&p, "pbox_metrics_requests_total",
		      (pbox_prom_labels){ "outcome", "served", NULL }, served);
	pbox_prom_u64(&p, "pbox_metrics_requests_total",
		      (pbox_prom_labels){ "outcome", "not_found", NULL }, nf);
	pbox_prom_u64(&p, "pbox_metrics_requests_total",
		      (pbox_prom_labels){ "outcome", "method_not_allowed", NULL }, bm);
	pbox_prom_u64(&p, "pbox_metrics_requests_total",
		      (pbox_prom_labels){ "outcome", "unavailable", NULL }, failed);
	pbox_prom_family(&p, "pbox_metrics_stale_total", "counter",
			 "Scrapes served an older rendering (the control thread did not answer "
			 "within 1 s)");
	pbox_prom_u64(&p, "pbox_metrics_stale_total", NULL, stale);
	pbox_prom_family(&p, "pbox_metrics_connections_cut_total", "counter",
			 "Connections shut down for lasting longer than the metrics timeout");
	pbox_prom_u64(&p, "pbox_metrics_connections_cut_total", NULL, cut);
	text = pbox_prom_finish(&p);
	copy = text != NULL ? strdup(text) : NULL;
	if (copy == NULL) {
		pbox_prom_free(&p);
		return;
	}
	pthread_mutex_lock(&m->lock);
	free(m->text);
	m->text = copy;
	m->len = p.len;
	m->generation++;
	m->rendered_ms = mono_ms();
	pthread_cond_broadcast(&m->rendered);
	pthread_mutex_unlock(&m->lock);
	pbox_prom_free(&p);
}

#else /* !PBOX_HAVE_MHD */

struct pbox_metrics {
	int unused;
};

struct pbox_metrics *pbox_metrics_start(const struct pbox_metrics_cfg *cfg, const char *daemon)
{
	PBOX_LOG_ERR(ADMIN,
		     "%s was built without libmicrohttpd: metrics = { listen = \"%s:%u\"; } cannot "
		     "be served (install libmicrohttpd-dev and rebuild, or remove the metrics "
		     "group)",
		     daemon, cfg->host, cfg->port);
	return NULL;
}

void pbox_metrics_stop(struct pbox_metrics *m)
{
	(void)m;
}

int pbox_metrics_fd(const struct pbox_metrics *m)
{
	(void)m;
	return -1;
}

uint16_t pbox_metrics_port(const struct pbox_metrics *m)
{
	(void)m;
	return 0;
}

void pbox_metrics_serve(struct pbox_metrics *m, pbox_metrics_render_fn *fn, void *arg)
{
	(void)m;
	(void)fn;
	(void)arg;
}

#endif /* PBOX_HAVE_MHD */
