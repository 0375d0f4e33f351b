/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * libpbox's registration (pbox_register): the keys announced to pboxd, the session
 * parameters of its answer, the data path (shared memory or UDP), the worker node and
 * the progress thread.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include "client_int.h"
#include "common/log.h"
#include "transport/shm/shm.h"
#include "transport/udp/udp.h"
#include "xport_select.h"

/* PBOX_VERSION_WORDS=crc: full CRC32C version words even where the appliance does not
 * verify them (a resend then notices any changed byte, not only a sampled one). */
static bool vwords_full(void)
{
	const char *v = getenv("PBOX_VERSION_WORDS");

	return v != NULL && strcmp(v, "crc") == 0;
}

static int parse_register(struct pbox_client *c, json_t *resp, const struct pbox_keyspec *ks,
			  uint32_t nkeys)
{
	json_t *ports = json_object_get(resp, "ports"), *map = json_object_get(resp, "core_map");
	const char *cookie = json_string_value(json_object_get(resp, "cookie"));
	const char *addr = json_string_value(json_object_get(resp, "data_addr"));
	uint32_t chunk_bytes = (uint32_t)json_integer_value(json_object_get(resp, "chunk_bytes"));
	uint32_t frag_bytes = (uint32_t)json_integer_value(json_object_get(resp, "frag_bytes"));
	uint32_t *core_map = NULL;
	size_t ncores = json_array_size(ports), i;
	char err[256];
	int rc;

	if (cookie == NULL || addr == NULL || ncores == 0 || ncores > PBOX_MAX_CORES ||
	    !json_is_array(map)) {
		return pbox_client_error(-EPROTO,
					 "register: pboxd's answer lacks the session parameters");
	}
	snprintf(c->data_addr, sizeof(c->data_addr), "%s", addr);
	snprintf(c->shm_name, sizeof(c->shm_name), "%s",
		 json_string_value(json_object_get(resp, "shm")) ?: "");
	core_map = calloc(json_array_size(map) + 1, sizeof(*core_map));
	c->cores = calloc(ncores, sizeof(*c->cores));
	if (core_map == NULL || c->cores == NULL) {
		free(core_map);
		return pbox_client_error(-ENOMEM, "out of memory");
	}
	for (i = 0; i < json_array_size(map); i++) {
		core_map[i] = (uint32_t)json_integer_value(json_array_get(map, i));
	}
	for (i = 0; i < ncores; i++) {
		json_int_t p = json_integer_value(json_array_get(ports, i));

		if (p <= 0 || p > 65535 ||
		    pbox_peer_from_str(&c->cores[i], addr, (uint16_t)p) != 0) {
			free(core_map);
			return pbox_client_error(-EPROTO, "register: bad data endpoint %s:%lld",
						 addr, (long long)p);
		}
	}
	rc = pbox_jobdesc_build(&c->desc, ks, nkeys, c->info.workers, (uint32_t)ncores, chunk_bytes,
				frag_bytes, core_map, err, sizeof(err));
	if (rc == 0 && c->desc.nchunks != json_array_size(map)) {
		pbox_jobdesc_free(&c->desc);
		snprintf(err, sizeof(err), "chunk map has %zu entries for %u chunks",
			 json_array_size(map), c->desc.nchunks);
		rc = -EPROTO;
	}
	free(core_map);
	if (rc < 0) {
		return pbox_client_error(rc, "register: %s", err);
	}
	c->info.cores = (uint32_t)ncores;
	c->info.chunk_bytes = chunk_bytes;
	c->info.frag_bytes = frag_bytes;
	c->info.nchunks = c->desc.nchunks;
	c->info.total_bytes = c->desc.total_bytes;
	c->cookie = strtoull(cookie, NULL, 16);
	if (c->cookie == 0) {
		return pbox_client_error(
			-EPROTO, "register: pboxd sent an invalid session cookie '%s'", cookie);
	}
	{
		json_int_t st = json_integer_value(json_object_get(resp, "staleness"));
		const char *flow = json_string_value(json_object_get(resp, "flow"));
		json_t *cr = json_object_get(resp, "credits");
		json_int_t credits = json_integer_value(cr);

		/* The slot table and the node's lanes are sized by it: a value we would have
		 * to guess at is a protocol error, not a default. */
		if (!json_is_integer(cr) || credits < 1 || credits > PBOX_MAX_CREDITS) {
			return pbox_client_error(
				-EPROTO,
				"register: pboxd sent no valid 'credits' (unacknowledged "
				"contributions per chunk, 1..%u); is it the same version as "
				"libpbox %s?",
				PBOX_MAX_CREDITS, PBOX_VERSION_STRING);
		}
		c->staleness = st < 0 ? UINT32_MAX : (uint32_t)st;
		c->credits = (uint32_t)credits;
		c->plain = flow != NULL && strcmp(flow, "plain") == 0;
		/* Version words (node.h). Full CRC32C words where they add something: the
		 * appliance verifies them (the job says "crc"), or PBOX_VERSION_WORDS=crc
		 * asks for them. Otherwise, in NOTIFY-ACK flow, sampled words kept by the
		 * node let a resend notice a buffer changed under it without a pass over
		 * every payload byte (UDP's own checksum covers the wire). A plain
		 * push resends from the node's own copy, which cannot change. */
		c->crc = json_is_true(json_object_get(resp, "crc")) || vwords_full();
		c->sampled_words = !c->plain && !c->crc;
		c->folds_late = json_is_true(json_object_get(resp, "folds_late"));
		memset(&c->dvf, 0, sizeof(c->dvf));
		if (json_object_get(resp, "dvf") != NULL &&
		    pbox_dvf_job_from_json(json_object_get(resp, "dvf"), &c->dvf, err,
					   sizeof(err)) != 0) {
			return pbox_client_error(-EPROTO,
						 "register: pboxd sent bad DVF settings: %s", err);
		}
		c->heartbeat_ms =
			(uint32_t)json_integer_value(json_object_get(resp, "heartbeat_ms"));
		c->resume_version =
			(uint32_t)json_integer_value(json_object_get(resp, "resume_version"));
		snprintf(c->info.sync, sizeof(c->info.sync), "%s",
			 json_string_value(json_object_get(resp, "sync"))
				 ? json_string_value(json_object_get(resp, "sync"))
				 : "bsp");
		c->info.staleness = c->staleness;
		c->info.credits = c->credits;
	}
	/* TSB: the job's results come down a broadcast tree (common/tsbmsg.h). */
	if (json_object_get(resp, "tsb_key") != NULL) {
		if (pbox_tsb_key_parse(json_string_value(json_object_get(resp, "tsb_key")),
				       &c->tsb_key) != 0) {
			return pbox_client_error(
				-EPROTO, "register: the appliance sent a malformed tsb_key");
		}
		c->tsb = true;
	}
	return 0;
}

/* Shared memory or UDP (xport_select.h); sets c->shm and info.transport. */
static int choose_transport(struct pbox_client *c, bool fault)
{
	const char *want = getenv("PBOX_TRANSPORT");
	enum pbox_xsel_mode mode;
	char why[160];

	if (pbox_xsel_parse(want, &mode) != 0) {
		return pbox_client_error(-EINVAL, "transport '%s': expected udp, shm or auto",
					 want);
	}
	if (pbox_xsel_want_shm(mode, c->shm_name, c->data_addr, fault, why, sizeof(why))) {
		c->shm = pbox_shm_client_open(c->shm_name, c->info.job, c->info.rank, c->cookie,
					      c->cores, c->info.cores, why, sizeof(why));
	}
	if (c->shm == NULL && mode == PBOX_XSEL_SHM) {
		return pbox_client_error(-EPROTONOSUPPORT,
					 "register: shared memory was asked for: %s", why);
	}
	snprintf(c->transport, sizeof(c->transport), "%s", c->shm ? "shm" : "udp");
	PBOX_LOG_DEBUG(TRANSPORT, "job %u rank %u: data path %s%s%s", c->info.job, c->info.rank,
		       c->transport, c->shm ? "" : ": ", c->shm ? "" : why);
	return 0;
}

/* The probe agent on the address pboxd sees this worker at (opts.local_addr, else the
 * control connection's local address). */
static int start_probe_agent(struct pbox_client *c)
{
	struct sockaddr_in sin;
	socklen_t len = sizeof(sin);
	char addr[INET_ADDRSTRLEN] = "";

	if (c->opts.local_addr != NULL) {
		snprintf(addr, sizeof(addr), "%s", c->opts.local_addr);
	} else if (getsockname(c->ctl_fd, (struct sockaddr *)&sin, &len) == 0 &&
		   sin.sin_family == AF_INET) {
		inet_ntop(AF_INET, &sin.sin_addr, addr, sizeof(addr));
	}
	return pbox_wprobe_create(c->opts.probe, addr, c->wake_fd, &c->probe);
}

int pbox_register(struct pbox_client *c, const struct pbox_key_info *keys, uint32_t nkeys)
{
	struct pbox_keyspec *ks;
	struct pbox_udp_cfg ucfg = { 0 };
	struct pbox_node_cfg ncfg = { 0 };
	json_t *arr, *resp = NULL;
	const char *fault;
	char err[256];
	int rc;

	if (c == NULL || keys == NULL || nkeys == 0) {
		return pbox_client_error(-EINVAL, "register: no keys given");
	}
	if (c->node != NULL) {
		return pbox_client_error(-EALREADY, "register: keys are already registered");
	}
	ks = calloc(nkeys, sizeof(*ks));
	arr = json_array();
	if (ks == NULL || arr == NULL) {
		free(ks);
		json_decref(arr);
		return pbox_client_error(-ENOMEM, "out of memory");
	}
	for (uint32_t i = 0; i < nkeys; i++) {
		ks[i].id = keys[i].id;
		ks[i].nelem = keys[i].nelem;
		json_array_append_new(arr, json_pack("[I, I]", (json_int_t)keys[i].id,
						     (json_int_t)keys[i].nelem));
	}
	if (c->wake_fd < 0) { /* a register refused earlier may have made both */
		c->wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	}
	rc = c->wake_fd < 0 ? -errno : c->probe == NULL ? start_probe_agent(c) : 0;
	if (rc < 0) {
		json_decref(arr);
		rc = pbox_client_error(
			rc,
			"register: cannot start the probe agent (PBOX_PROBE=off turns it "
			"off): %s",
			strerror(-rc));
		goto out;
	}
	rc = pbox_client_ctl_call(c,
				  c->probe != NULL
					  ? json_pack("{s:s, s:o, s:s}", "op", "register", "keys",
						      arr, "probe", pbox_wprobe_addr(c->probe))
					  : json_pack("{s:s, s:o}", "op", "register", "keys", arr),
				  &resp);
	if (rc < 0) {
		goto out;
	}
	rc = parse_register(c, resp, ks, nkeys);
	if (rc < 0) {
		goto out;
	}
	if (json_object_get(resp, "plan") != NULL) {
		pbox_client_plan_event(c, json_object_get(resp, "plan"));
	}
	fault = c->opts.fault ? c->opts.fault : getenv("PBOX_FAULT");
	if (pbox_fault_parse(fault, &ucfg.fault, err, sizeof(err)) != 0) {
		rc = pbox_client_error(-EINVAL, "PBOX_FAULT: %s", err);
		goto out;
	}
	ucfg.addr = c->opts.local_addr;
	ucfg.kpace = pbox_kpace_env_on(); /* rate: set_kpace_rate() */
	ucfg.kpace_peer = c->data_addr;   /* whose route says which qdisc to check */
	c->udp = pbox_udp_open(&ucfg);
	/* One operation slot per unacknowledged contribution the job allows per chunk. */
	c->ops = calloc((size_t)nkeys * c->credits, sizeof(*c->ops));
	if (c->udp == NULL || c->ops == NULL) {
		rc = pbox_client_error(-ENOMEM,
				       "register: cannot set up the data socket (see log)");
		goto out;
	}
	ncfg.desc = &c->desc;
	ncfg.job = c->info.job;
	ncfg.rank = c->info.rank;
	ncfg.cookie = c->cookie;
	ncfg.server_opt = c->info.mode == PBOX_JOB_SERVER_OPTIMIZER;
	ncfg.cores = c->cores;
	rc = choose_transport(c,
			      ucfg.fault.drop > 0 || ucfg.fault.dup > 0 || ucfg.fault.reorder > 0);
	if (rc < 0) {
		goto out;
	}
	if (c->shm == NULL && pbox_udp_kpace(c->udp)) {
		char info[320];

		PBOX_LOG_INFO(TRANSPORT, "job %u rank %u: udp port %u: %s", c->info.job,
			      c->info.rank, pbox_udp_port(c->udp),
			      pbox_udp_info_str(c->udp, info, sizeof(info)));
	}
	ncfg.tx = c->shm != NULL ? &pbox_shm_client_tx_ops : &pbox_udp_tx_ops;
	ncfg.tx_ctx = c->shm != NULL ? (void *)c->shm : (void *)c->udp;
	ncfg.rto_ms = c->opts.rto_ms;
	if (c->shm != NULL) {
		/* Rings lose nothing unless one is full (counted on both sides): a timeout
		 * there means a descheduled peer on a busy host, not a loss; a low floor would
		 * only resend what is about to be read. */
		ncfg.rto_min_ms = PBOX_SHM_RTO_MIN_MS;
		ncfg.pto_min_ms = PBOX_SHM_RTO_MIN_MS;
		ncfg.rto_ms = PBOX_MAX(ncfg.rto_ms, (uint32_t)PBOX_SHM_RTO_MIN_MS);
	}
	ncfg.timeout_ms = c->opts.timeout_ms;
	ncfg.max_inflight = c->opts.max_inflight;
	ncfg.window_bytes = c->opts.window_bytes;
	ncfg.staleness = c->staleness;
	ncfg.accept_newer = c->folds_late && c->info.mode != PBOX_JOB_SERVER_OPTIMIZER;
	ncfg.result_lag = c->info.mode == PBOX_JOB_BROADCAST ? c->staleness : 0;
	ncfg.credits = c->credits;
	ncfg.plain = c->plain;
	ncfg.crc = c->crc;
	ncfg.sampled_words = c->sampled_words;
	ncfg.dvf = &c->dvf;
	ncfg.done = pbox_client_op_done;
	ncfg.done_arg = c;
	c->node = pbox_node_create(&ncfg);
	if (c->node != NULL && c->tsb && pbox_node_tsb_key(c->node, &c->tsb_key) != 0) {
		pbox_node_destroy(c->node);
		c->node = NULL;
	}
	if (c->node == NULL) {
		rc = pbox_client_error(-ENOMEM, "register: out of memory for the worker node");
		goto out;
	}
	pthread_mutex_lock(&c->lock);
	pbox_client_dvf_plan(c); /* a plan that came with the register answer */
	pthread_mutex_unlock(&c->lock);
	fcntl(c->ctl_fd, F_SETFL, fcntl(c->ctl_fd, F_GETFL) | O_NONBLOCK);
	rc = pthread_create(&c->thread, NULL, pbox_client_progress_main, c);
	if (rc != 0) {
		/* No thread would ever complete an operation: accept none. */
		pbox_node_destroy(c->node);
		c->node = NULL;
		rc = pbox_client_error(-rc, "register: cannot start the progress thread: %s",
				       strerror(rc));
		goto out;
	}
	c->thread_started = true;
	rc = 0;
out:
	json_decref(resp);
	free(ks);
	return rc;
}
