/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Fuzz harness: pboxd's control-channel request path: the framing of common/ctlproto.c
 * (pbox_linebuf_fill / pbox_linebuf_next in, pbox_ctl_send out), JSON decoding (jansson's
 * json_loads, as pboxd calls it) and the request handlers of dataplane/pboxd/sessions.c
 * (pboxd_sessions_hello, _register, _leave, _disconnect, _tick, _status), on an appliance
 * configured with two jobs (through pboxd_config_load, so the configuration is what pboxd
 * would build) and a data plane that was never started: with no core and no RCU
 * registration, pboxd_dp_publish swaps the job table and drops the old one at once, on the
 * calling thread (nothing else can read it). A register that starts a session is answered
 * later (its chunk state is allocated by the sessions' allocator thread): the harness waits
 * on pboxd_sessions_fd and calls pboxd_sessions_poll, as pboxd's control loop does, so
 * sessions really start; an input may also leave it pending while other requests, closes
 * and ticks arrive, or until the end (pboxd_sessions_destroy with an allocation in flight).
 *
 * Only public functions are called: the dispatch by "op" is the harness's own (it mirrors
 * control.c's), so the harness does not depend on control.c's internals.
 *
 * One input is one appliance from a fresh state; events, each chosen by one byte:
 *  - raw bytes arrive on one of six connections (through a pipe and the connection's
 *    line buffer; complete lines are parsed and dispatched);
 *  - a structured request arrives on a connection: hello / register / leave / ping /
 *    stats with fields the input picks from right and wrong values (the right job, rank
 *    and token, the configured keys, or mutations of them), encoded with json_dumps and
 *    sent as a line, so deep paths (sessions, cookies, key-set checks) are reached;
 *  - a connection closes (pboxd_sessions_disconnect);
 *  - time passes (pboxd_sessions_tick: heartbeats, members declared dead and kicked);
 *  - the status request; the shutdown abort;
 *  - the allocator's answer: wait on pboxd_sessions_fd, then pboxd_sessions_poll.
 *
 * Invariants checked beyond the sanitizers: every response is an object with a boolean
 * "ok", and a refusal has a positive "errno" and an "error" message; an accepted register
 * has a 16-hex-digit cookie and a core map within the cores; a deferred register is
 * answered (within 10 s), once, through send_event, and only to a connection that waits;
 * events and kicks reach only open connections; the published job table is sorted and every
 * job in it has its state; after pboxd_sessions_destroy no job is published, and dropping
 * the last table frees it (pboxd_dp_lifetime_stats).
 *
 * Register sizes are bounded by the appliance's memory_budget (16M below), as in pboxd:
 * larger key sets are refused by the budget checks, so libFuzzer's RSS limit is not hit.
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <sys/mman.h>
#include <unistd.h>

#include "common/ctlproto.h"
#include "common/log.h"
#include "fuzz.h"
#include "harness.h"
#include "pboxd/sessions.h"

#define NCONN            6
#define ALLOC_TIMEOUT_MS 10000

/* Job 1: free key set, 2 workers, server optimizer, BSP (a lost worker aborts).
 * Job 2: fixed keys, 3 workers, aggregate, 2 credits, a lost worker is dropped. */
static const char g_conf[] =
	"appliance = { cores = 2; chunk_bytes = 1024; mtu = 576; worker_timeout = 3;\n"
	"  memory_budget = \"16M\"; };\n"
	"jobs = (\n"
	"  { id = 1; token = \"s3cret\"; workers = 2; mode = \"server-optimizer\";\n"
	"    optimizer = { name = \"adam\"; lr = 0.001; }; deterministic = true; },\n"
	"  { id = 2; token = \"t0ken-two\"; workers = 3; mode = \"aggregate\"; reduce = \"mean\";\n"
	"    keys = ( [0, 300], [7, 16] ); flow = { credits = 2; };\n"
	"    on_worker_loss = \"continue\"; }\n"
	");\n";

struct conn {
	struct pboxd_member_ref ref; /* first: the callbacks get a pointer to it */
	struct pbox_linebuf lb;
	bool open;
	bool kicked;
	bool awaiting; /* its register was deferred: the answer comes through send_event */
};

struct fix {
	struct pboxd_dp dp;
	struct pboxd_sessions *s;
	struct conn conns[NCONN];
	uint64_t now_ms;
};

static struct pboxd_config g_cfg;
static int g_pipe[2] = { -1, -1 };
static int g_null = -1;

static void once(void)
{
	char err[512], path[64];
	int fd;

	pbox_log_set_level(PBOX_LOGC_COUNT, PBOX_LOG_LVL_DEBUG);
	pbox_log_set_sink(pbox_test_log_silent, NULL);
	fd = memfd_create("pboxd.conf", MFD_CLOEXEC);
	FUZZ_CHECK(fd >= 0 && write(fd, g_conf, sizeof(g_conf) - 1) == sizeof(g_conf) - 1,
		   "memfd: %s", strerror(errno));
	snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
	pboxd_config_defaults(&g_cfg);
	FUZZ_CHECK(pboxd_config_load(&g_cfg, path, err, sizeof(err)) == 0, "config: %s", err);
	FUZZ_CHECK(pboxd_config_check(&g_cfg, err, sizeof(err)) == 0, "config: %s", err);
	close(fd);
	FUZZ_CHECK(pipe2(g_pipe, O_NONBLOCK | O_CLOEXEC) == 0, "pipe: %s", strerror(errno));
	g_null = open("/dev/null", O_WRONLY | O_CLOEXEC);
	FUZZ_CHECK(g_null >= 0, "/dev/null: %s", strerror(errno));
}

/* ---- connections ------------------------------------------------------------------------ */

static void check_response(const char *op, const json_t *resp);

static void on_event(struct pboxd_member_ref *ref, json_t *obj)
{
	struct conn *c = (struct conn *)(void *)ref;

	FUZZ_CHECK(c->open, "an event for a closed connection");
	FUZZ_CHECK(json_is_object(obj), "an event that is not an object");
	if (json_object_get(obj, "event") == NULL) {
		/* The answer of a deferred register (pboxd_sessions_poll). */
		FUZZ_CHECK(c->awaiting, "%s: a response nobody waits for", c->ref.peer);
		FUZZ_CHECK(!c->ref.pending, "%s: answered but still pending", c->ref.peer);
		c->awaiting = false;
		check_response("register", obj);
		if (getenv("PBOX_FUZZ_VERBOSE") != NULL) {
			char *text = json_dumps(obj, JSON_COMPACT);

			fprintf(stderr, "(deferred register) -> %s\n", text);
			free(text);
		}
		FUZZ_CHECK(pbox_ctl_send(g_null, obj, 0) == 0, "pbox_ctl_send failed");
		return;
	}
	FUZZ_CHECK(json_string_value(json_object_get(obj, "event")) != NULL,
		   "an event without \"event\"");
}

static void on_kick(struct pboxd_member_ref *ref)
{
	struct conn *c = (struct conn *)(void *)ref;

	FUZZ_CHECK(c->open, "a kick for a closed connection");
	c->kicked = true;
}

static void conn_open(struct fix *x, struct conn *c)
{
	unsigned i = (unsigned)(c - x->conns);

	memset(&c->ref, 0, sizeof(c->ref));
	snprintf(c->ref.peer, sizeof(c->ref.peer), "10.0.0.%u:%u", 1 + i, 40000 + i);
	c->ref.last_seen_ms = x->now_ms;
	c->ref.send_event = on_event;
	c->ref.kick = on_kick;
	pbox_linebuf_init(&c->lb);
	c->open = true;
	c->kicked = false;
	c->awaiting = false;
}

static void conn_close(struct fix *x, struct conn *c)
{
	if (!c->open) {
		return;
	}
	pboxd_sessions_disconnect(x->s, &c->ref);
	pbox_linebuf_free(&c->lb);
	c->open = false;
}

static struct conn *pick(struct fix *x, struct fz *in)
{
	struct conn *c = &x->conns[fz_below(in, NCONN)];

	if (!c->open) {
		conn_open(x, c);
	}
	return c;
}

/* ---- requests ------------------------------------------------------------------------- */

static void check_response(const char *op, const json_t *resp)
{
	const json_t *ok = json_object_get(resp, "ok");

	FUZZ_CHECK(json_is_object(resp) && json_is_boolean(ok), "%s: a response without \"ok\"",
		   op);
	if (!json_is_true(ok)) {
		const char *msg = json_string_value(json_object_get(resp, "error"));

		FUZZ_CHECK(json_integer_value(json_object_get(resp, "errno")) > 0 && msg != NULL &&
				   msg[0] != '\0',
			   "%s: a refusal without errno and message", op);
		return;
	}
	if (strcmp(op, "register") == 0) {
		const char *cookie = json_string_value(json_object_get(resp, "cookie"));
		const json_t *map = json_object_get(resp, "core_map"), *v;
		size_t i;

		FUZZ_CHECK(cookie != NULL && strlen(cookie) == 16 &&
				   strspn(cookie, "0123456789abcdef") == 16 &&
				   strcmp(cookie, "0000000000000000") != 0,
			   "register: cookie '%s'", cookie ? cookie : "(none)");
		FUZZ_CHECK(json_is_array(map) && json_array_size(map) > 0, "register: no core map");
		json_array_foreach(map, i, v)
		{
			FUZZ_CHECK(json_is_integer(v) && json_integer_value(v) >= 0 &&
					   json_integer_value(v) < (json_int_t)g_cfg.ncores,
				   "register: core_map[%zu]", i);
		}
	}
}

/* What pboxd does with one request line (control.c's dispatch, by the public API). */
static void handle_line(struct fix *x, struct conn *c, const char *line)
{
	json_error_t jerr;
	json_t *req = json_loads(line, 0, &jerr), *resp = NULL;
	const char *op;

	if (req == NULL || !json_is_object(req)) {
		json_decref(req);
		return;
	}
	op = json_string_value(json_object_get(req, "op"));
	c->ref.last_seen_ms = x->now_ms;
	if (op == NULL || strcmp(op, "ping") == 0) {
		json_decref(req);
		return;
	}
	FUZZ_CHECK(c->ref.pending == c->awaiting, "%s: pending %d, awaiting an answer %d",
		   c->ref.peer, c->ref.pending, c->awaiting);
	if (c->ref.pending) {
		/* control.c refuses every request but ping until the register is answered */
		json_decref(req);
		return;
	}
	if (strcmp(op, "hello") == 0) {
		resp = pboxd_sessions_hello(x->s, &c->ref, req);
	} else if (strcmp(op, "register") == 0) {
		resp = pboxd_sessions_register(x->s, &c->ref, req);
		if (resp == NULL) {
			FUZZ_CHECK(c->ref.pending, "register: no answer and not pending");
			c->awaiting = true;
		}
	} else if (strcmp(op, "leave") == 0) {
		resp = pboxd_sessions_leave(x->s, &c->ref);
	} else if (strcmp(op, "stats") == 0) {
		resp = pboxd_sessions_status(x->s);
		FUZZ_CHECK(json_is_array(resp) && json_array_size(resp) == g_cfg.njobs,
			   "status: not one entry per job");
		json_decref(resp);
		resp = NULL;
	}
	if (resp != NULL) {
		char *text;

		check_response(op, resp);
		/* The response goes out as pboxd sends it (to /dev/null here). */
		FUZZ_CHECK(pbox_ctl_send(g_null, resp, 0) == 0, "pbox_ctl_send failed");
		text = json_dumps(resp, JSON_COMPACT);
		if (getenv("PBOX_FUZZ_VERBOSE") != NULL) {
			fprintf(stderr, "%s -> %s\n", line, text);
		}
		free(text);
		json_decref(resp);
	}
	json_decref(req);
}

/* Bytes arrive on connection c: through the pipe and its line buffer, as from a socket. */
static void arrive(struct fix *x, struct conn *c, const void *bytes, size_t len)
{
	const uint8_t *p = bytes;
	char *line;

	while (len > 0) {
		ssize_t n = write(g_pipe[1], p, len);
		long got;

		FUZZ_CHECK(n > 0, "pipe write: %s", strerror(errno));
		p += n;
		len -= (size_t)n;
		got = pbox_linebuf_fill(&c->lb, g_pipe[0]);
		FUZZ_CHECK(got == n || got == -E2BIG, "linebuf_fill returned %ld for %zd bytes",
			   got, n);
		while (c->open && (line = pbox_linebuf_next(&c->lb)) != NULL) {
			FUZZ_CHECK(strchr(line, '\n') == NULL, "a line with a newline");
			handle_line(x, c, line);
		}
		if (got == -E2BIG) {
			conn_close(x, c); /* pboxd closes a connection with an oversized line */
			return;
		}
	}
}

static void raw_bytes(struct fix *x, struct fz *in)
{
	struct conn *c = pick(x, in);
	uint8_t buf[512];
	size_t len = fz_bytes(in, buf, fz_below(in, sizeof(buf)));

	arrive(x, c, buf, len);
}

static json_t *pick_keys(struct fz *in)
{
	uint8_t k = fz_u8(in);
	json_t *a;

	json_int_t id, n;

	switch (k % 8) {
	case 0:
	case 1:
		return json_pack("[[i,i],[i,i]]", 0, 300, 7, 16); /* job 2's configuration */
	case 2:
		id = fz_u8(in); /* read in this order whatever the compiler */
		n = 1 + fz_u16(in);
		return json_pack("[[I,I]]", id, n);
	case 3:
		return json_pack("[[i,i],[i,i]]", 0, 300, 7, 17); /* one element off */
	case 4:
		return json_pack("[[i,i],[i,i]]", 5, 1, 5, 2); /* a duplicate id */
	case 5:
		a = json_array();
		for (unsigned count = fz_below(in, 64); count > 0; count--) {
			id = fz_u16(in);
			n = fz_u8(in);
			json_array_append_new(a, json_pack("[I,I]", id, n));
		}
		return a;
	case 6:
		/* Wrong shapes and types. */
		switch (fz_u8(in) % 5) {
		case 0:
			return json_pack("[[i]]", 1);
		case 1:
			return json_pack("[[s,i]]", "x", 1);
		case 2:
			return json_pack("[[i,f]]", 1, 2.5);
		case 3:
			return json_pack("{s:i}", "a", 1);
		default:
			return json_pack("[[i,I]]", -1, (json_int_t)1 << 41);
		}
	default:
		return json_array();
	}
}

/* Returns true when a deferred register is to stay pending for now. */
static bool structured(struct fix *x, struct fz *in)
{
	static const char *const tokens[] = { "s3cret", "t0ken-two", "", "s3cre", "s3cret\u00e9" };
	struct conn *c = pick(x, in);
	uint8_t op = fz_u8(in), f = fz_u8(in);
	json_t *req = NULL;
	bool defer = false;
	char *text;

	switch (op % 8) {
	case 0:
	case 1:
	case 2: {
		/* hello: the right job/rank/token with probability, else a wrong one */
		json_int_t job = (f & 3) == 3 ? (json_int_t)fz_u32(in) - 2 : 1 + (f & 1);
		json_int_t rank =
			(f & 4) ? (json_int_t)(int8_t)fz_u8(in) : (json_int_t)fz_below(in, 4);
		const char *token =
			(f & 8) ? tokens[fz_below(in, 5)] : (job == 1 ? tokens[0] : tokens[1]);

		req = json_pack("{s:s, s:I, s:I, s:s, s:i}", "op", "hello", "job", job, "rank",
				rank, "token", token, "version",
				(f & 16) ? 2 : PBOX_CTL_PROTO_VERSION);
		if (f & 32) {
			json_object_del(req, "token"); /* or another field missing */
		}
		if ((f & 192) == 192) {
			json_object_set_new(req, "rank", json_string("0"));
		}
		break;
	}
	case 3:
	case 4:
		req = json_pack("{s:s, s:o}", "op", "register", "keys", pick_keys(in));
		defer = (f & 128) != 0;
		break;
	case 5:
		req = json_pack("{s:s}", "op", "leave");
		break;
	case 6:
		req = json_pack("{s:s}", "op", (f & 1) ? "stats" : "ping");
		break;
	default:
		req = json_pack("{s:s}", "op", (f & 1) ? "bogus" : "hello!");
		break;
	}
	FUZZ_CHECK(req != NULL, "json_pack failed");
	text = json_dumps(req, JSON_COMPACT);
	json_decref(req);
	FUZZ_CHECK(text != NULL, "json_dumps failed");
	/* The line, sometimes cut in two (a request split across TCP segments). */
	{
		size_t len = strlen(text), cut = (f & 64) ? fz_below(in, (uint32_t)len + 1) : len;

		arrive(x, c, text, cut);
		arrive(x, c, text + cut, len - cut);
		arrive(x, c, "\n", 1);
	}
	free(text);
	return defer;
}

static bool any_awaiting(const struct fix *x)
{
	for (unsigned i = 0; i < NCONN; i++) {
		if (x->conns[i].open && x->conns[i].awaiting) {
			return true;
		}
	}
	return false;
}

/* The allocator's answers, as pboxd's control loop takes them: when pboxd_sessions_fd is
 * readable, pboxd_sessions_poll. Waits until no open connection awaits a register answer. */
static void allocator_answers(struct fix *x)
{
	struct pollfd p = { .fd = pboxd_sessions_fd(x->s), .events = POLLIN };
	uint64_t start = pboxd_now_ms();

	while (any_awaiting(x)) {
		int n = poll(&p, 1, 100);

		FUZZ_CHECK(n >= 0 || errno == EINTR, "poll: %s", strerror(errno));
		if (n > 0) {
			pboxd_sessions_poll(x->s);
		}
		FUZZ_CHECK(pboxd_now_ms() - start < ALLOC_TIMEOUT_MS,
			   "a deferred register is not answered after %u ms", ALLOC_TIMEOUT_MS);
	}
}

static void check_table(const struct fix *x)
{
	const struct pbox_jobtab *tab = x->dp.tab;

	if (tab == NULL) {
		return;
	}
	FUZZ_CHECK(tab->njobs <= g_cfg.njobs, "%u jobs published", tab->njobs);
	for (uint32_t i = 0; i < tab->njobs; i++) {
		const struct pbox_job *j = tab->jobs[i];

		FUZZ_CHECK(j->state != NULL && j->wire.desc != NULL && j->wire.cookies != NULL &&
				   j->live != NULL,
			   "job %u published without its state", j->wire.id);
		FUZZ_CHECK(i == 0 || tab->jobs[i - 1]->wire.id < j->wire.id, "table not sorted");
	}
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static struct fix x;
	struct fz in;
	unsigned events = 0;

	if (g_pipe[0] < 0) {
		once();
	}
	memset(&x, 0, sizeof(x));
	x.now_ms = 1000000;
	/* The configured transport, never started: no core, no RCU registration (tab_release
	 * asks the transport whether it keeps retired states). */
	x.dp.ops = pboxd_transport_find(g_cfg.transport);
	FUZZ_CHECK(x.dp.ops != NULL, "transport '%s' not in this build", g_cfg.transport);
	x.s = pboxd_sessions_create(&g_cfg, &x.dp);
	FUZZ_CHECK(x.s != NULL, "pboxd_sessions_create failed");
	fz_init(&in, data, size);
	while (!fz_empty(&in) && events++ < 1024) {
		uint8_t ev = fz_u8(&in);
		bool defer = false;

		switch (ev % 16) {
		case 0:
		case 1:
		case 2:
		case 3:
			raw_bytes(&x, &in);
			break;
		case 12:
			conn_close(&x, &x.conns[fz_below(&in, NCONN)]);
			break;
		case 13:
			/* Time passes: heartbeats checked, silent members kicked and closed (as
			 * the control loop does after the tick). */
			x.now_ms += (uint64_t)fz_u8(&in) * 50;
			pboxd_sessions_tick(x.s, x.now_ms);
			for (unsigned i = 0; i < NCONN; i++) {
				if (x.conns[i].open && x.conns[i].kicked) {
					conn_close(&x, &x.conns[i]);
				}
			}
			break;
		case 14:
			if ((ev >> 4) == 15) {
				pboxd_sessions_abort_all(x.s, "pboxd is shutting down");
			} else if ((ev >> 4) >= 12) {
				/* Nothing: the deferred registers are answered below. */
			} else {
				/* A member that keeps sending heartbeats. */
				struct conn *c = &x.conns[fz_below(&in, NCONN)];

				c->ref.last_seen_ms = x.now_ms;
			}
			break;
		default:
			defer = structured(&x, &in);
			break;
		}
		/* Sessions start: the control loop answers deferred registers (unless the
		 * input keeps them pending while other events arrive). */
		if (!defer) {
			allocator_answers(&x);
		}
		check_table(&x);
		FUZZ_CHECK(pboxd_sessions_active(x.s) <= g_cfg.njobs, "more sessions than jobs");
	}
	for (unsigned i = 0; i < NCONN; i++) {
		conn_close(&x, &x.conns[i]);
	}
	pboxd_sessions_destroy(x.s);
	/* Nothing stays published; dropping the last table frees it at once (no core ever
	 * read it), and no publish was refused. */
	{
		struct pboxd_dp_lifetime before, after;
		const struct pbox_jobtab *last = x.dp.tab;

		FUZZ_CHECK(last == NULL || last->njobs == 0, "%u jobs still published at exit",
			   last != NULL ? last->njobs : 0);
		pboxd_dp_lifetime_stats(&x.dp, &before);
		FUZZ_CHECK(pboxd_dp_publish(&x.dp, NULL) == 0, "publish(NULL) failed");
		pboxd_dp_lifetime_stats(&x.dp, &after);
		FUZZ_CHECK(x.dp.tab == NULL && after.tables_freed ==
						       before.tables_freed + (last != NULL ? 1 : 0),
			   "the last table was not freed");
		FUZZ_CHECK(after.publish_nomem == 0, "%llu publishes refused",
			   (unsigned long long)after.publish_nomem);
	}
	return 0;
}
