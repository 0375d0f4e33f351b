/* SPDX-License-Identifier: BSD-3-Clause */
/* The shared-memory transport: layout, descriptor passing, the worker's side (shm.h). */
#include "shm.h"

#include <endian.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "common/log.h"

int pbox_shm_layout(struct pbox_shm_layout *lay, uint32_t ncores, uint64_t ring_bytes)
{
	if (ncores == 0 || ncores > PBOX_SHM_MAX_CORES || !pbox_shm_ring_size_ok(ring_bytes)) {
		return -EINVAL;
	}
	lay->ncores = ncores;
	lay->ring_bytes = ring_bytes;
	lay->ctl_bytes = PBOX_ALIGN_UP((uint64_t)ncores * PBOX_SHM_CTL_PER_CORE, 4096u);
	lay->seg_bytes = lay->ctl_bytes + 2ull * ncores * ring_bytes;
	return 0;
}

int pbox_shm_sockaddr(const char *name, struct sockaddr_un *su)
{
	size_t n = strlen(name);

	memset(su, 0, sizeof(*su));
	su->sun_family = AF_UNIX;
	if (n == 0 || n >= sizeof(su->sun_path)) {
		return -ENAMETOOLONG;
	}
	memcpy(su->sun_path, name, n);
	if (name[0] == '@') {
		su->sun_path[0] = '\0'; /* abstract: no file, no trailing NUL */
		return (int)(offsetof(struct sockaddr_un, sun_path) + n);
	}
	return (int)(offsetof(struct sockaddr_un, sun_path) + n + 1);
}

int pbox_shm_send_fds(int sock, const void *msg, size_t len, const int *fds, unsigned nfds)
{
	union {
		char buf[CMSG_SPACE(sizeof(int) * (PBOX_SHM_MAX_FDS))];
		struct cmsghdr align;
	} ctl;
	struct iovec iov = { .iov_base = (void *)msg, .iov_len = len };
	struct msghdr mh = { .msg_iov = &iov, .msg_iovlen = 1 };

	if (nfds > PBOX_SHM_MAX_FDS) {
		return -EINVAL;
	}
	if (nfds != 0) {
		struct cmsghdr *cm;

		memset(&ctl, 0, sizeof(ctl));
		mh.msg_control = ctl.buf;
		mh.msg_controllen = CMSG_SPACE(sizeof(int) * nfds);
		cm = CMSG_FIRSTHDR(&mh);
		cm->cmsg_level = SOL_SOCKET;
		cm->cmsg_type = SCM_RIGHTS;
		cm->cmsg_len = CMSG_LEN(sizeof(int) * nfds);
		memcpy(CMSG_DATA(cm), fds, sizeof(int) * nfds);
	}
	if (sendmsg(sock, &mh, MSG_NOSIGNAL) != (ssize_t)len) {
		return errno != 0 ? -errno : -EIO;
	}
	return 0;
}

int pbox_shm_recv_fds(int sock, void *msg, size_t len, int *fds, unsigned maxfds, unsigned *nfds)
{
	union {
		char buf[CMSG_SPACE(sizeof(int) * (PBOX_SHM_MAX_FDS))];
		struct cmsghdr align;
	} ctl;
	struct iovec iov = { .iov_base = msg, .iov_len = len };
	struct msghdr mh = { .msg_iov = &iov,
			     .msg_iovlen = 1,
			     .msg_control = ctl.buf,
			     .msg_controllen = sizeof(ctl.buf) };
	ssize_t n = recvmsg(sock, &mh, MSG_CMSG_CLOEXEC);

	*nfds = 0;
	if (n < 0) {
		return -errno;
	}
	for (struct cmsghdr *cm = CMSG_FIRSTHDR(&mh); cm != NULL; cm = CMSG_NXTHDR(&mh, cm)) {
		if (cm->cmsg_level == SOL_SOCKET && cm->cmsg_type == SCM_RIGHTS) {
			unsigned cnt = (unsigned)((cm->cmsg_len - CMSG_LEN(0)) / sizeof(int));
			int tmp[PBOX_SHM_MAX_FDS];

			memcpy(tmp, CMSG_DATA(cm),
			       sizeof(int) * PBOX_MIN(cnt, PBOX_ARRAY_SIZE(tmp)));
			for (unsigned i = 0; i < cnt && i < PBOX_ARRAY_SIZE(tmp); i++) {
				if (*nfds < maxfds) {
					fds[(*nfds)++] = tmp[i];
				} else {
					close(tmp[i]); /* more than asked for: not kept */
				}
			}
		}
	}
	if (n == 0) {
		return -ECONNRESET; /* the peer closed its socket */
	}
	if ((size_t)n != len || (mh.msg_flags & MSG_TRUNC)) {
		return -EPROTO;
	}
	if (mh.msg_flags & MSG_CTRUNC) {
		/* The message is whole, its descriptors not: the kernel could not install
		 * them (this process at its open-file limit) or more came than asked for. */
		return -EMFILE;
	}
	return 0;
}

/* ---- the worker's side -------------------------------------------------------------- */

/* A registered region as the progress thread looks it up: written by the registration
 * calls (any thread) under a seqlock (seq odd while written), read by the sender. */
struct shm_wregion {
	_Atomic uint32_t seq;
	_Atomic uint32_t id; /* pboxd's id; 0: free */
	_Atomic uintptr_t base;
	_Atomic uint64_t len;
};

struct pbox_shm_client {
	int sock;
	int memfd;
	int wake_fd;
	int core_fd[PBOX_SHM_MAX_CORES];
	uint8_t *base;
	struct pbox_shm_layout lay;
	const uint8_t *res[PBOX_SHM_MAX_CORES]; /* results' arenas, read-only (NULL: none) */
	size_t res_len[PBOX_SHM_MAX_CORES];
	const struct pbox_peer *cores;
	uint32_t ncores;
	uint32_t rx_next; /* the core whose ring is read first (round robin) */
	uint64_t queued;  /* payload datagrams sent (all copied: released at once) */
	enum pbox_shm_err err;
	struct pbox_shm_client_stats stats;
	struct pbox_shm_prod tx[PBOX_SHM_MAX_CORES]; /* worker -> core k */
	struct pbox_shm_cons rx[PBOX_SHM_MAX_CORES]; /* core k -> worker */
	struct pbox_shm_dgram dg[PBOX_SHM_BURST];
	struct pbox_shm_split split[PBOX_SHM_BURST];
	bool is_split[PBOX_SHM_BURST];
	pthread_mutex_t reg_lock; /* registration calls */
	_Atomic uint32_t nreg_hi; /* regions slots in use are below this */
	uint32_t reg_last;        /* sender: the slot of the last hit */
	uint32_t reg_seq;         /* registration requests sent (under reg_lock) */
	struct shm_wregion reg[PBOX_SHM_MAX_REGIONS];
};

void pbox_shm_client_close(struct pbox_shm_client *c)
{
	if (c == NULL) {
		return;
	}
	if (c->stats.stale + c->stats.bad_desc != 0) { /* said only when it happened */
		PBOX_LOG_INFO(TRANSPORT,
			      "shm: %llu results read in place, %llu descriptors dropped as stale "
			      "(buffer reused before read), %llu out of bounds",
			      (unsigned long long)c->stats.rx_desc,
			      (unsigned long long)c->stats.stale,
			      (unsigned long long)c->stats.bad_desc);
	}
	if (c->base != NULL) {
		munmap(c->base, c->lay.seg_bytes);
	}
	for (uint32_t i = 0; i < PBOX_SHM_MAX_REGIONS; i++) {
		if (atomic_load_explicit(&c->reg[i].id, memory_order_relaxed) != 0) {
			munmap((void *)atomic_load_explicit(&c->reg[i].base, memory_order_relaxed),
			       (size_t)atomic_load_explicit(&c->reg[i].len, memory_order_relaxed));
		}
	}
	pthread_mutex_destroy(&c->reg_lock);
	for (uint32_t k = 0; k < PBOX_SHM_MAX_CORES; k++) {
		if (c->res[k] != NULL) {
			munmap((void *)c->res[k], c->res_len[k]);
		}
	}
	for (uint32_t k = 0; k < PBOX_SHM_MAX_CORES; k++) {
		if (c->core_fd[k] >= 0) {
			close(c->core_fd[k]);
		}
	}
	if (c->wake_fd >= 0) {
		close(c->wake_fd);
	}
	if (c->memfd >= 0) {
		close(c->memfd);
	}
	if (c->sock >= 0) {
		close(c->sock);
	}
	free(c);
}

static void close_all(const int *fds, unsigned n)
{
	for (unsigned i = 0; i < n; i++) {
		close(fds[i]);
	}
}

/* Map the results' arenas the welcome announced (fds: one per core) read-only, after
 * checking each is as pboxd promised: its size, and sealed so that neither side can
 * resize it under the other's mapping. 0 or -1 with the reason in err. */
static int map_results(struct pbox_shm_client *c, const struct pbox_shm_welcome *w, const int *fds,
		       char *err, size_t errlen)
{
	for (uint32_t k = 0; k < w->nres; k++) {
		struct stat st;
		int seals = fcntl(fds[k], F_GET_SEALS);
		void *p;

		if (fstat(fds[k], &st) != 0 || (uint64_t)st.st_size != w->res_bytes[k] ||
		    w->res_bytes[k] == 0 || w->res_bytes[k] > SIZE_MAX || seals < 0 ||
		    (seals & PBOX_SHM_RES_SEALS) != PBOX_SHM_RES_SEALS) {
			snprintf(err, errlen,
				 "core %u's results' arena: %llu bytes announced, not a sealed "
				 "memfd of that size",
				 k, (unsigned long long)w->res_bytes[k]);
			return -1;
		}
		p = mmap(NULL, (size_t)w->res_bytes[k], PROT_READ, MAP_SHARED, fds[k], 0);
		if (p == MAP_FAILED) {
			snprintf(err, errlen,
				 "cannot map core %u's results' arena (%llu bytes): %s", k,
				 (unsigned long long)w->res_bytes[k], strerror(errno));
			return -1;
		}
		c->res[k] = p;
		c->res_len[k] = (size_t)w->res_bytes[k];
	}
	return 0;
}

struct pbox_shm_client *pbox_shm_client_open(const char *name, uint32_t job, uint32_t rank,
					     uint64_t cookie, const struct pbox_peer *cores,
					     uint32_t ncores, char *err, size_t errlen)
{
	struct pbox_shm_client *c = calloc(1, sizeof(*c));
	struct pbox_shm_hello hello = { .magic = PBOX_SHM_MAGIC,
					.version = PBOX_SHM_VERSION,
					.job = job,
					.rank = rank,
					.cookie = cookie };
	struct pbox_shm_welcome w;
	struct sockaddr_un su;
	struct timeval tv = { .tv_sec = 10 };
	int fds[PBOX_SHM_MAX_FDS], res_fd[PBOX_SHM_MAX_CORES];
	unsigned nfds = 0, nres_fd = 0;
	struct stat stt;
	int sl, rc;

	if (c == NULL) {
		snprintf(err, errlen, "out of memory");
		return NULL;
	}
	c->sock = c->memfd = c->wake_fd = -1;
	pthread_mutex_init(&c->reg_lock, NULL);
	for (uint32_t k = 0; k < PBOX_SHM_MAX_CORES; k++) {
		c->core_fd[k] = -1;
	}
	c->cores = cores;
	c->ncores = ncores;
	if (ncores == 0 || ncores > PBOX_SHM_MAX_CORES) {
		snprintf(err, errlen, "%u appliance cores (at most %u over shared memory)", ncores,
			 PBOX_SHM_MAX_CORES);
		goto fail;
	}
	sl = pbox_shm_sockaddr(name, &su);
	if (sl < 0) {
		snprintf(err, errlen, "bad socket name '%s'", name);
		goto fail;
	}
	c->sock = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
	if (c->sock < 0 || setsockopt(c->sock, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv)) != 0 ||
	    connect(c->sock, (struct sockaddr *)&su, (socklen_t)sl) != 0) {
		snprintf(err, errlen, "cannot connect to %s: %s", name, strerror(errno));
		goto fail;
	}
	rc = pbox_shm_send_fds(c->sock, &hello, sizeof(hello), NULL, 0);
	if (rc == 0) {
		rc = pbox_shm_recv_fds(c->sock, &w, sizeof(w), fds, PBOX_ARRAY_SIZE(fds), &nfds);
	}
	/* Every descriptor received is owned from here on, whatever follows. */
	if (nfds > 0) {
		c->memfd = fds[0];
	}
	if (nfds > 1) {
		c->wake_fd = fds[1];
	}
	for (unsigned i = 2; i < nfds; i++) {
		if (i - 2 < ncores && ncores <= PBOX_SHM_MAX_CORES) {
			c->core_fd[i - 2] = fds[i];
		} else if (nres_fd < PBOX_SHM_MAX_CORES) {
			res_fd[nres_fd++] = fds[i]; /* results' memfds: mapped below, then closed */
		} else {
			close(fds[i]);
		}
	}
	if (rc != 0) {
		snprintf(err, errlen, "%s: no welcome: %s", name,
			 rc == -EPROTO ? "malformed answer" : strerror(-rc));
		goto fail;
	}
	if (w.magic != PBOX_SHM_MAGIC || w.version != PBOX_SHM_VERSION) {
		snprintf(err, errlen, "%s: not a pbox shared-memory socket of this version", name);
		goto fail;
	}
	if (w.status != 0) {
		snprintf(err, errlen, "%s: refused: %s", name, strerror((int)w.status));
		goto fail;
	}
	if (w.ncores != ncores || (w.nres != 0 && w.nres != ncores) ||
	    nfds != ncores + 2 + w.nres || pbox_shm_layout(&c->lay, ncores, w.ring_bytes) != 0 ||
	    c->lay.seg_bytes != w.seg_bytes || fstat(c->memfd, &stt) != 0 ||
	    (uint64_t)stt.st_size != w.seg_bytes) {
		snprintf(err, errlen, "%s: inconsistent welcome (%u cores, %u descriptors)", name,
			 w.ncores, nfds);
		goto fail;
	}
	c->base = mmap(NULL, c->lay.seg_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, c->memfd, 0);
	if (c->base == MAP_FAILED) {
		c->base = NULL;
		snprintf(err, errlen, "cannot map %llu bytes: %s",
			 (unsigned long long)c->lay.seg_bytes, strerror(errno));
		goto fail;
	}
	/* The results' memfds sit after the core eventfds, which are ncores, not 64. */
	if (w.nres != 0 && map_results(c, &w, res_fd, err, errlen) != 0) {
		goto fail;
	}
	for (uint32_t k = 0; k < ncores; k++) {
		pbox_shm_prod_init(&c->tx[k], pbox_shm_ctl_w2a(c->base, k),
				   pbox_shm_data_w2a(c->base, &c->lay, k), c->lay.ring_bytes);
		pbox_shm_cons_init(&c->rx[k], pbox_shm_ctl_a2w(c->base, k),
				   pbox_shm_data_a2w(c->base, &c->lay, k), c->lay.ring_bytes);
		c->rx[k].accept_desc = c->res[k] != NULL; /* else a descriptor breaks it */
	}
	close_all(res_fd, nres_fd); /* the mappings keep the memory */
	return c;
fail:
	close_all(res_fd, nres_fd);
	pbox_shm_client_close(c);
	return NULL;
}

/* A descriptor from core k's ring: read once, bounded by the arena's mapping (pboxd is
 * trusted, but a wrong offset must not become a read outside the mapping), and dropped
 * if its buffer was already rewritten (the node's probes recover it). */
static bool take_desc(struct pbox_shm_client *c, uint32_t k, const struct pbox_shm_dgram *dg,
		      struct pbox_shm_split *sp)
{
	const struct pbox_wire_hdr *h = (const struct pbox_wire_hdr *)(const void *)dg->hdr;
	struct pbox_shm_desc d;
	size_t lim = c->res_len[k];

	memcpy(&d, dg->payload, sizeof(d));
	if (pbox_unlikely(c->res[k] == NULL || d.len == 0 || d.len != be16toh(h->frag_len) ||
			  d.data_off > lim || d.len > lim - d.data_off || d.gen_off % 8 != 0 ||
			  d.gen_off > lim - 8)) {
		c->stats.bad_desc++;
		return false;
	}
	sp->payload = c->res[k] + d.data_off;
	sp->len = d.len;
	sp->gen = (const uint64_t *)(const void *)(c->res[k] + d.gen_off);
	sp->want = d.gen;
	if (__atomic_load_n(sp->gen, __ATOMIC_ACQUIRE) != d.gen) {
		c->stats.stale++;
		return false;
	}
	c->stats.rx_desc++;
	return true;
}

const struct pbox_shm_split *pbox_shm_client_split(const struct pbox_shm_client *c, unsigned i)
{
	return i < PBOX_SHM_BURST && c->is_split[i] ? &c->split[i] : NULL;
}

unsigned pbox_shm_client_rx(struct pbox_shm_client *c, struct pbox_rx_pkt *pkts, unsigned max)
{
	unsigned n = 0, used = 0;

	max = PBOX_MIN(max, (unsigned)PBOX_ARRAY_SIZE(c->dg));
	for (uint32_t i = 0; i < c->ncores && used < max; i++) {
		uint32_t k = (c->rx_next + i) % c->ncores;
		/* Popped after the previous cores' records (dropped ones too): the header
		 * copies handed out stay valid. */
		struct pbox_shm_dgram *dg = c->dg + used;
		unsigned got = pbox_shm_cons_pop(&c->rx[k], dg, max - used);

		used += got;
		if (pbox_unlikely(c->rx[k].err != PBOX_SHM_OK) && c->err == PBOX_SHM_OK) {
			c->err = c->rx[k].err;
			PBOX_LOG_ERR(TRANSPORT, "shm: ring of core %u: %s", k,
				     pbox_shm_err_name(c->err));
		}
		for (unsigned j = 0; j < got; j++) {
			/* pboxd is trusted here as it is over UDP: the datagram is read in place.
			 */
			if (dg[j].kind == PBOX_SHM_REC_DESC) {
				if (!take_desc(c, k, &dg[j], &c->split[n])) {
					continue;
				}
				pkts[n].data = dg[j].hdr;
				pkts[n].len = PBOX_WIRE_HDR_LEN + c->split[n].len;
				c->is_split[n] = true;
			} else {
				pkts[n].data = dg[j].data;
				pkts[n].len = dg[j].len;
				c->is_split[n] = false;
			}
			pkts[n].from = c->cores[k];
			c->stats.rx_bytes += pkts[n].len;
			n++;
		}
	}
	c->rx_next = (c->rx_next + 1) % c->ncores;
	c->stats.rx_pkts += n;
	return n;
}

void pbox_shm_client_rx_done(struct pbox_shm_client *c)
{
	uint64_t one = 1;

	for (uint32_t k = 0; k < c->ncores; k++) {
		/* A core holding results back for want of room is told there is some. */
		if (pbox_shm_cons_release_wake(&c->rx[k])) {
			c->stats.wakes++;
			if (write(c->core_fd[k], &one, sizeof(one)) < 0) {
				/* saturated: the core is awake anyway */
			}
		}
	}
}

bool pbox_shm_client_sleep_prepare(struct pbox_shm_client *c)
{
	for (uint32_t k = 0; k < c->ncores; k++) {
		if (!pbox_shm_cons_sleep_prepare(&c->rx[k])) {
			pbox_shm_client_sleep_end(c);
			return false;
		}
	}
	return true;
}

void pbox_shm_client_sleep_end(struct pbox_shm_client *c)
{
	uint64_t v;

	for (uint32_t k = 0; k < c->ncores; k++) {
		pbox_shm_cons_sleep_end(&c->rx[k]);
	}
	if (read(c->wake_fd, &v, sizeof(v)) < 0) {
		/* EAGAIN: nobody rang */
	}
}

int pbox_shm_client_wake_fd(const struct pbox_shm_client *c)
{
	return c->wake_fd;
}

int pbox_shm_client_sock_fd(const struct pbox_shm_client *c)
{
	return c->sock;
}

enum pbox_shm_err pbox_shm_client_err(const struct pbox_shm_client *c)
{
	return c->err;
}

const uint8_t *pbox_shm_client_results(const struct pbox_shm_client *c, uint32_t k, size_t *len)
{
	if (k >= c->ncores || c->res[k] == NULL) {
		*len = 0;
		return NULL;
	}
	*len = c->res_len[k];
	return c->res[k];
}

const struct pbox_shm_client_stats *pbox_shm_client_stats(const struct pbox_shm_client *c)
{
	return &c->stats;
}

/* ---- registered memory (worker) ------------------------------------------------------ */

static void wreg_set(struct shm_wregion *r, uint32_t id, uintptr_t base, uint64_t len)
{
	uint32_t s = atomic_load_explicit(&r->seq, memory_order_relaxed);

	atomic_store_explicit(&r->seq, s + 1, memory_order_relaxed);
	atomic_thread_fence(memory_order_release);
	atomic_store_explicit(&r->base, base, memory_order_relaxed);
	atomic_store_explicit(&r->len, len, memory_order_relaxed);
	atomic_store_explicit(&r->id, id, memory_order_relaxed);
	atomic_store_explicit(&r->seq, s + 2, memory_order_release);
}

int pbox_shm_client_mem_reg(struct pbox_shm_client *c, size_t bytes, void **out, char *err,
			    size_t errlen)
{
	struct pbox_shm_memreq rq = { .magic = PBOX_SHM_MAGIC, .op = PBOX_SHM_MEM_REG };
	struct pbox_shm_memrep rp;
	long pg = sysconf(_SC_PAGESIZE);
	uint32_t slot = PBOX_SHM_MAX_REGIONS;
	unsigned nfds = 0;
	int fd = -1, rc, junk[1];
	void *m = MAP_FAILED;

	if (bytes == 0 || bytes > SIZE_MAX - (size_t)pg) {
		snprintf(err, errlen, "register %zu bytes: out of range", bytes);
		return -EINVAL;
	}
	bytes = PBOX_ALIGN_UP(bytes, (size_t)pg);
	pthread_mutex_lock(&c->reg_lock);
	for (uint32_t i = 0; i < PBOX_SHM_MAX_REGIONS; i++) {
		if (atomic_load_explicit(&c->reg[i].id, memory_order_relaxed) == 0) {
			slot = i;
			break;
		}
	}
	if (slot == PBOX_SHM_MAX_REGIONS) {
		snprintf(err, errlen, "register %zu bytes: %u regions registered already", bytes,
			 PBOX_SHM_MAX_REGIONS);
		rc = -ENOSPC;
		goto out;
	}
	fd = memfd_create("pbox-mem", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	if (fd < 0 || ftruncate(fd, (off_t)bytes) != 0 ||
	    (m = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0)) == MAP_FAILED ||
	    fcntl(fd, F_ADD_SEALS, PBOX_SHM_MEM_SEALS) != 0) {
		rc = -errno;
		snprintf(err, errlen, "register %zu bytes: cannot create a sealed memfd: %s", bytes,
			 strerror(errno));
		goto out;
	}
	rq.bytes = bytes;
	rq.seq = ++c->reg_seq;
	rc = pbox_shm_send_fds(c->sock, &rq, sizeof(rq), &fd, 1);
	/* Answers to earlier requests that timed out may come first: their regions are not
	 * used, so they are given back. */
	while (rc == 0 && (rc = pbox_shm_recv_fds(c->sock, &rp, sizeof(rp), junk, 0, &nfds)) == 0 &&
	       rp.magic == PBOX_SHM_MAGIC && rp.op == PBOX_SHM_MEM_REG && rp.seq != rq.seq) {
		if (rp.status == 0) {
			struct pbox_shm_memreq un = { .magic = PBOX_SHM_MAGIC,
						      .op = PBOX_SHM_MEM_UNREG,
						      .region = rp.region };

			(void)pbox_shm_send_fds(c->sock, &un, sizeof(un), NULL, 0);
		}
	}
	if (rc != 0) {
		snprintf(err, errlen, "register %zu bytes: no answer from pboxd: %s", bytes,
			 rc == -EPROTO || rc == -ECONNRESET ? "connection ended" : strerror(-rc));
		rc = rc == -EPROTO ? -ECONNRESET : rc;
		goto out;
	}
	if (rp.magic != PBOX_SHM_MAGIC || rp.op != PBOX_SHM_MEM_REG || rp.status > 4095 ||
	    (rp.status == 0 && rp.region == 0)) {
		snprintf(err, errlen, "register %zu bytes: malformed answer", bytes);
		rc = -EPROTO;
		goto out;
	}
	if (rp.status != 0) {
		snprintf(err, errlen, "register %zu bytes: pboxd refused: %s", bytes,
			 rp.status == ENOSPC ? "its limit of regions or bytes per worker (shm."
					       "max_regions, shm.max_region_mb)"
					     : strerror((int)rp.status));
		rc = -(int)rp.status;
		goto out;
	}
	wreg_set(&c->reg[slot], rp.region, (uintptr_t)m, bytes);
	if (slot + 1 > atomic_load_explicit(&c->nreg_hi, memory_order_relaxed)) {
		atomic_store_explicit(&c->nreg_hi, slot + 1, memory_order_release);
	}
	*out = m;
	m = MAP_FAILED;
	rc = 0;
out:
	pthread_mutex_unlock(&c->reg_lock);
	if (m != MAP_FAILED) {
		munmap(m, bytes);
	}
	if (fd >= 0) {
		close(fd); /* the mappings (ours, pboxd's) keep the memory */
	}
	return rc;
}

/* mem_unreg and mem_detach: the same, but detach leaves the mapping to the caller. */
static int mem_forget(struct pbox_shm_client *c, void *p, bool unmap)
{
	struct pbox_shm_memreq rq = { .magic = PBOX_SHM_MAGIC, .op = PBOX_SHM_MEM_UNREG };
	int rc = -EINVAL;

	pthread_mutex_lock(&c->reg_lock);
	for (uint32_t i = 0; i < PBOX_SHM_MAX_REGIONS; i++) {
		struct shm_wregion *r = &c->reg[i];
		uint32_t id = atomic_load_explicit(&r->id, memory_order_relaxed);
		uint64_t len = atomic_load_explicit(&r->len, memory_order_relaxed);

		if (id == 0 ||
		    atomic_load_explicit(&r->base, memory_order_relaxed) != (uintptr_t)p) {
			continue;
		}
		wreg_set(r, 0, 0, 0);
		rq.region = id;
		/* pboxd may have ended the connection: then there is nobody to tell. */
		(void)pbox_shm_send_fds(c->sock, &rq, sizeof(rq), NULL, 0);
		if (unmap) {
			munmap(p, (size_t)len);
		}
		rc = 0;
		break;
	}
	pthread_mutex_unlock(&c->reg_lock);
	return rc;
}

int pbox_shm_client_mem_unreg(struct pbox_shm_client *c, void *p)
{
	return mem_forget(c, p, true);
}

int pbox_shm_client_mem_detach(struct pbox_shm_client *c, void *p)
{
	return mem_forget(c, p, false);
}

/* Whether [p, p + len) lies in a registered region: then *ref says where. Read under each
 * entry's seqlock (a registration may run on another thread). */
static bool find_region(struct pbox_shm_client *c, const void *p, uint32_t len,
			struct pbox_shm_ref *ref)
{
	uint32_t hi = atomic_load_explicit(&c->nreg_hi, memory_order_acquire);
	uintptr_t a = (uintptr_t)p;

	for (uint32_t n = 0; n < hi; n++) {
		uint32_t i = (c->reg_last + n) % hi;
		struct shm_wregion *r = &c->reg[i];
		uint32_t s1, s2, id;
		uintptr_t base;
		uint64_t rlen;

		do {
			s1 = atomic_load_explicit(&r->seq, memory_order_acquire);
			id = atomic_load_explicit(&r->id, memory_order_relaxed);
			base = atomic_load_explicit(&r->base, memory_order_relaxed);
			rlen = atomic_load_explicit(&r->len, memory_order_relaxed);
			atomic_thread_fence(memory_order_acquire);
			s2 = atomic_load_explicit(&r->seq, memory_order_relaxed);
		} while ((s1 & 1u) != 0 || s1 != s2);
		if (id != 0 && a >= base && a - base <= rlen && len <= rlen - (a - base)) {
			ref->region = id;
			ref->len = len;
			ref->off = a - base;
			c->reg_last = i;
			return true;
		}
	}
	return false;
}

static void wake_core(struct pbox_shm_client *c, uint32_t k)
{
	uint64_t one = 1;

	if (pbox_shm_prod_need_wake(&c->tx[k])) {
		c->stats.wakes++;
		if (write(c->core_fd[k], &one, sizeof(one)) < 0) {
			/* saturated counter: the core is awake anyway */
		}
	}
}

static int core_of(const struct pbox_shm_client *c, const struct pbox_peer *to)
{
	for (uint32_t k = 0; k < c->ncores; k++) {
		if (c->cores[k].ip == to->ip && c->cores[k].port == to->port) {
			return (int)k;
		}
	}
	return -1;
}

static int client_send(void *ctx, const struct pbox_peer *to, const struct pbox_wire_hdr *hdr,
		       const void *payload, uint32_t len)
{
	struct pbox_shm_client *c = ctx;
	int k = core_of(c, to);
	struct pbox_shm_ref ref;
	bool by_ref;
	int rc;

	if (pbox_unlikely(k < 0)) {
		c->stats.foreign++;
		return -EHOSTUNREACH;
	}
	/* In a registered region: pboxd reads it there (a re-send re-reads it too). */
	by_ref = len > PBOX_SHM_REF_MIN &&
		 atomic_load_explicit(&c->nreg_hi, memory_order_relaxed) != 0 &&
		 find_region(c, payload, len, &ref);
	rc = by_ref ? pbox_shm_push_ref(&c->tx[k], hdr, &ref)
		    : pbox_shm_push(&c->tx[k], hdr, payload, len);
	if (pbox_unlikely(rc == -ENOBUFS)) {
		/* The core drains its rings at memory speed when it runs: give it the CPU (and
		 * a wake-up, in case it sleeps) before dropping like a full socket. Yield a few
		 * times, then sleep in small steps: on a busy host it may be descheduled. */
		struct timespec t0, t, nap = { 0, 50000 };
		unsigned spins = 0;

		c->stats.tx_waits++;
		clock_gettime(CLOCK_MONOTONIC, &t0);
		do {
			wake_core(c, (uint32_t)k);
			if (spins++ < 16) {
				sched_yield();
			} else {
				nanosleep(&nap, NULL);
			}
			rc = by_ref ? pbox_shm_push_ref(&c->tx[k], hdr, &ref)
				    : pbox_shm_push(&c->tx[k], hdr, payload, len);
			clock_gettime(CLOCK_MONOTONIC, &t);
		} while (rc == -ENOBUFS &&
			 (t.tv_sec - t0.tv_sec) * 1000000000L + (t.tv_nsec - t0.tv_nsec) <
				 PBOX_SHM_SEND_WAIT_MS * 1000000L);
	}
	if (rc != 0) {
		c->stats.tx_full++;
		return rc;
	}
	c->stats.tx_pkts++;
	c->stats.tx_bytes += PBOX_WIRE_HDR_LEN + len;
	c->stats.tx_ref += by_ref;
	c->queued += len != 0;
	return 0;
}

static void client_flush(void *ctx)
{
	struct pbox_shm_client *c = ctx;

	for (uint32_t k = 0; k < c->ncores; k++) {
		wake_core(c, k);
	}
}

static uint64_t client_queued(void *ctx)
{
	return ((struct pbox_shm_client *)ctx)->queued;
}

/* Every payload was copied into a ring by send: nothing stays referenced. */
static uint64_t client_reclaim(void *ctx, uint64_t upto)
{
	(void)upto;
	return ((struct pbox_shm_client *)ctx)->queued;
}

const struct pbox_tx_ops pbox_shm_client_tx_ops = {
	.send = client_send,
	.flush = client_flush,
	.queued = client_queued,
	.reclaim = client_reclaim,
};
