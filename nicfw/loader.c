/* SPDX-License-Identifier: BSD-3-Clause */
/* Loader and map operations of the pbox XDP program (see loader.h). */
#include "loader.h"

#include <errno.h>
#include <limits.h>
#include <net/if.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <unistd.h>

#include <bpf/bpf.h>
#include <bpf/libbpf.h>
#include <linux/if_link.h>

#include "common/jobdesc.h"
#include "common/log.h"
#include "pbox_xdp.skel.h"

_Static_assert(PBOX_XDP_MAX_CORES == PBOX_MAX_CORES, "XDP steering covers every core");
_Static_assert((PBOX_XDP_MAX_CORES & (PBOX_XDP_MAX_CORES - 1)) == 0, "masked core index");

#define BPFFS_ROOT         "/sys/fs/bpf"
#define DEFAULT_PIN_ROOT   BPFFS_ROOT "/pbox"
#define BPF_FS_MAGIC_VALUE 0xcafe4a11
#define PROG_NAME          "pbox_xdp"

/* What the maps hold for one job (so that updates write only what changed). */
struct xdp_job {
	uint32_t id;
	uint32_t nworkers;
	uint64_t *cookies;   /* nworkers */
	uint32_t nchunks;    /* slots of pbox_chunks it owns (0: none) */
	uint32_t chunk_base; /* the first of them */
};

struct pbox_xdp {
	struct pbox_xdp_bpf *skel;
	char ifname[IF_NAMESIZE];
	int ifindex;            /* 0: not attached */
	uint32_t attach_flags;  /* XDP_FLAGS_DRV_MODE or XDP_FLAGS_SKB_MODE */
	char pin_dir[PATH_MAX]; /* "": not pinned */
	uint32_t max_chunks;    /* chunk slots (a multiple of 8) */
	uint8_t *owners;        /* pbox_chunks, mapped: the owner core of each slot */
	size_t owners_len;
	struct xdp_job *jobs;
	uint32_t njobs, cap_jobs;
};

/* libbpf's messages go to pbox's log: warnings as warnings, the rest at debug level. */
static int libbpf_print(enum libbpf_print_level level, const char *fmt, va_list ap)
	__attribute__((format(printf, 2, 0)));

static int libbpf_print(enum libbpf_print_level level, const char *fmt, va_list ap)
{
	char buf[512];
	size_t n;

	vsnprintf(buf, sizeof(buf), fmt, ap);
	n = strlen(buf);
	while (n > 0 && buf[n - 1] == '\n') {
		buf[--n] = '\0';
	}
	if (level == LIBBPF_WARN) {
		PBOX_LOG_WARN(TRANSPORT, "libbpf: %s", buf);
	} else {
		PBOX_LOG_DEBUG(TRANSPORT, "libbpf: %s", buf);
	}
	return 0;
}

int pbox_xdp_mode_parse(const char *s, enum pbox_xdp_mode *mode)
{
	if (strcmp(s, "auto") == 0) {
		*mode = PBOX_XDP_MODE_AUTO;
	} else if (strcmp(s, "native") == 0) {
		*mode = PBOX_XDP_MODE_NATIVE;
	} else if (strcmp(s, "generic") == 0) {
		*mode = PBOX_XDP_MODE_GENERIC;
	} else {
		return -EINVAL;
	}
	return 0;
}

static const char *flags_mode_name(uint32_t flags)
{
	return flags & XDP_FLAGS_DRV_MODE   ? "native"
	       : flags & XDP_FLAGS_SKB_MODE ? "generic"
					    : "none";
}

const char *pbox_xdp_attach_mode(const struct pbox_xdp *x)
{
	return x->ifindex == 0 ? "none" : flags_mode_name(x->attach_flags);
}

int pbox_xdp_prog_fd(const struct pbox_xdp *x)
{
	return bpf_program__fd(x->skel->progs.pbox_xdp);
}

static struct bpf_map *map_of(struct pbox_xdp *x, unsigned i)
{
	struct bpf_map *maps[] = { x->skel->maps.pbox_jobs,   x->skel->maps.pbox_cookies,
				   x->skel->maps.pbox_chunks, x->skel->maps.pbox_xsks,
				   x->skel->maps.pbox_stats,  x->skel->maps.pbox_owner };

	return i < sizeof(maps) / sizeof(maps[0]) ? maps[i] : NULL;
}

/* Make sure BPFFS_ROOT is a bpffs (mount one if it is not): 0 or -errno. */
static int ensure_bpffs(void)
{
	struct statfs sfs;

	if (statfs(BPFFS_ROOT, &sfs) == 0 && (unsigned long)sfs.f_type == BPF_FS_MAGIC_VALUE) {
		return 0;
	}
	if (mount("bpf", BPFFS_ROOT, "bpf", 0, "mode=0700") != 0) {
		int rc = -errno;

		PBOX_LOG_WARN(TRANSPORT, "%s is not a bpffs and mounting one failed: %s",
			      BPFFS_ROOT, strerror(errno));
		return rc;
	}
	PBOX_LOG_INFO(TRANSPORT, "mounted a bpffs on %s", BPFFS_ROOT);
	return 0;
}

/* mkdir -p of the pin directory (two levels below a bpffs at most). */
static int make_dirs(const char *path)
{
	char tmp[PATH_MAX];

	snprintf(tmp, sizeof(tmp), "%s", path);
	for (char *p = tmp + 1; *p != '\0'; p++) {
		if (*p == '/') {
			*p = '\0';
			if (mkdir(tmp, 0700) != 0 && errno != EEXIST) {
				return -errno;
			}
			*p = '/';
		}
	}
	if (mkdir(tmp, 0700) != 0 && errno != EEXIST) {
		return -errno;
	}
	return 0;
}

static uint32_t map_id(int fd)
{
	struct bpf_map_info mi;
	uint32_t len = sizeof(mi);

	memset(&mi, 0, sizeof(mi));
	return bpf_obj_get_info_by_fd(fd, &mi, &len) == 0 ? mi.id : 0;
}

/* Remove the pins that are still of our maps (a newer loader may have pinned its own in
 * their place), then the directory if that leaves it empty. */
static void unpin_all(struct pbox_xdp *x)
{
	char path[PATH_MAX + 64];

	if (x->pin_dir[0] == '\0') {
		return;
	}
	for (unsigned i = 0; map_of(x, i) != NULL; i++) {
		int fd;

		snprintf(path, sizeof(path), "%s/%s", x->pin_dir, bpf_map__name(map_of(x, i)));
		fd = bpf_obj_get(path);
		if (fd >= 0 && map_id(fd) == map_id(bpf_map__fd(map_of(x, i)))) {
			unlink(path);
		}
		if (fd >= 0) {
			close(fd);
		}
	}
	rmdir(x->pin_dir);
}

/* Pin every map under pin_dir, replacing stale pins of an earlier run. Failures are logged
 * and leave the program unpinned (pins are for operators; the data path does not need
 * them). */
static void pin_all(struct pbox_xdp *x, const char *root)
{
	char path[PATH_MAX + 64];
	int rc;

	if (strncmp(root, BPFFS_ROOT "/", sizeof(BPFFS_ROOT)) == 0 && ensure_bpffs() != 0) {
		return;
	}
	snprintf(x->pin_dir, sizeof(x->pin_dir), "%s/%s", root, x->ifname);
	rc = make_dirs(x->pin_dir);
	if (rc != 0) {
		PBOX_LOG_WARN(TRANSPORT,
			      "%s: cannot create the pin directory %s: %s; maps not pinned",
			      x->ifname, x->pin_dir, strerror(-rc));
		x->pin_dir[0] = '\0';
		return;
	}
	for (unsigned i = 0; map_of(x, i) != NULL; i++) {
		snprintf(path, sizeof(path), "%s/%s", x->pin_dir, bpf_map__name(map_of(x, i)));
		if (unlink(path) == 0) {
			PBOX_LOG_INFO(TRANSPORT, "%s: removed the stale pin %s", x->ifname, path);
		}
		rc = bpf_map__pin(map_of(x, i), path);
		if (rc != 0) {
			PBOX_LOG_WARN(TRANSPORT, "%s: cannot pin %s: %s; maps not pinned",
				      x->ifname, path, strerror(-rc));
			unpin_all(x);
			x->pin_dir[0] = '\0';
			return;
		}
	}
	PBOX_LOG_INFO(TRANSPORT, "%s: XDP maps pinned under %s", x->ifname, x->pin_dir);
}

/* The name of program id (into name, at least 16 bytes). 0 or -errno. */
static int prog_name(uint32_t id, char *name, size_t len)
{
	struct bpf_prog_info info;
	uint32_t ilen = sizeof(info);
	int fd = bpf_prog_get_fd_by_id(id), rc;

	if (fd < 0) {
		return -errno;
	}
	memset(&info, 0, sizeof(info));
	rc = bpf_obj_get_info_by_fd(fd, &info, &ilen);
	close(fd);
	if (rc != 0) {
		return -errno;
	}
	snprintf(name, len, "%s", info.name);
	return 0;
}

/* The start time of process pid (/proc/<pid>/stat field 22), or 0 if it is gone. */
static uint64_t proc_start_time(uint32_t pid)
{
	char path[64], buf[1024], *p;
	unsigned long long t = 0;
	size_t n;
	FILE *f;

	snprintf(path, sizeof(path), "/proc/%u/stat", pid);
	f = fopen(path, "r");
	if (f == NULL) {
		return 0;
	}
	n = fread(buf, 1, sizeof(buf) - 1, f);
	fclose(f);
	buf[n] = '\0';
	/* After the command name (which may hold spaces and parentheses): fields 3.. */
	p = strrchr(buf, ')');
	if (p == NULL || sscanf(p + 2,
				"%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %*u %*u %*d "
				"%*d %*d %*d %*d %*d %llu",
				&t) != 1) {
		return 0;
	}
	return t;
}

/* The owner recorded with program id (its bound pbox_owner map). 0, or -ENOENT (a program
 * without one) or -errno. */
static int prog_owner(uint32_t id, struct pbox_xdp_owner *owner)
{
	struct bpf_prog_info info;
	uint32_t ids[16], len = sizeof(info), key = 0;
	int fd = bpf_prog_get_fd_by_id(id), rc = -ENOENT;

	if (fd < 0) {
		return -errno;
	}
	memset(&info, 0, sizeof(info));
	info.nr_map_ids = 16;
	info.map_ids = (uint64_t)(uintptr_t)ids;
	if (bpf_obj_get_info_by_fd(fd, &info, &len) != 0) {
		rc = -errno;
		close(fd);
		return rc;
	}
	close(fd);
	for (uint32_t i = 0; i < info.nr_map_ids && i < 16 && rc == -ENOENT; i++) {
		struct bpf_map_info mi;
		uint32_t mlen = sizeof(mi);
		int mfd = bpf_map_get_fd_by_id(ids[i]);

		if (mfd < 0) {
			continue;
		}
		memset(&mi, 0, sizeof(mi));
		if (bpf_obj_get_info_by_fd(mfd, &mi, &mlen) == 0 &&
		    strcmp(mi.name, "pbox_owner") == 0 &&
		    bpf_map_lookup_elem(mfd, &key, owner) == 0) {
			rc = 0;
		}
		close(mfd);
	}
	return rc;
}

/* Record this process as the owner of the loaded program. 0 or -errno (logged). */
static int set_owner(struct pbox_xdp *x, const char *who)
{
	struct pbox_xdp_owner o = { .pid = (uint32_t)getpid() };
	int fd = bpf_map__fd(x->skel->maps.pbox_owner);
	uint32_t key = 0;

	o.start_time = proc_start_time(o.pid);
	/* The program does not use the map: bind it, so that it is listed with it. */
	if (bpf_map_update_elem(fd, &key, &o, BPF_ANY) != 0 ||
	    bpf_prog_bind_map(pbox_xdp_prog_fd(x), fd, NULL) != 0) {
		int rc = -errno;

		PBOX_LOG_ERR(TRANSPORT, "%s: XDP: cannot record the owner: %s", who,
			     strerror(errno));
		return rc;
	}
	return 0;
}

/*
 * Find what is attached to the interface: our stale program (set *stale_flags to its mode),
 * or ours still owned by a running process, or another one (-EBUSY, logged).
 */
static int find_stale(struct pbox_xdp *x, uint32_t *stale_flags)
{
	LIBBPF_OPTS(bpf_xdp_query_opts, q);
	struct {
		uint32_t id;
		uint32_t flags;
	} att[2];
	char name[32];
	int rc;

	*stale_flags = 0;
	rc = bpf_xdp_query(x->ifindex, 0, &q);
	if (rc != 0) {
		PBOX_LOG_ERR(TRANSPORT, "%s: cannot query its XDP programs: %s", x->ifname,
			     strerror(-rc));
		return rc;
	}
	if (q.hw_prog_id != 0) {
		PBOX_LOG_ERR(TRANSPORT,
			     "%s: an offloaded XDP program (id %u) is attached; not "
			     "replacing it",
			     x->ifname, q.hw_prog_id);
		return -EBUSY;
	}
	att[0].id = q.drv_prog_id;
	att[0].flags = XDP_FLAGS_DRV_MODE;
	att[1].id = q.skb_prog_id;
	att[1].flags = XDP_FLAGS_SKB_MODE;
	for (int i = 0; i < 2; i++) {
		if (att[i].id == 0) {
			continue;
		}
		rc = prog_name(att[i].id, name, sizeof(name));
		if (rc != 0 || strcmp(name, PROG_NAME) != 0) {
			PBOX_LOG_ERR(TRANSPORT,
				     "%s: another XDP program (id %u, %s) is attached in %s mode; "
				     "not replacing it (detach it first)",
				     x->ifname, att[i].id, rc == 0 ? name : "name unknown",
				     flags_mode_name(att[i].flags));
			return -EBUSY;
		}
		{
			struct pbox_xdp_owner o;

			if (prog_owner(att[i].id, &o) == 0 && o.pid != 0 &&
			    proc_start_time(o.pid) == o.start_time) {
				PBOX_LOG_ERR(TRANSPORT,
					     "%s: its %s (id %u, %s mode) belongs to a running "
					     "process (pid %u, another pboxd?); not replacing it",
					     x->ifname, PROG_NAME, att[i].id,
					     flags_mode_name(att[i].flags), o.pid);
				return -EBUSY;
			}
		}
		PBOX_LOG_WARN(TRANSPORT,
			      "%s: a stale %s (id %u, %s mode) from an earlier pboxd is attached; "
			      "replacing it",
			      x->ifname, PROG_NAME, att[i].id, flags_mode_name(att[i].flags));
		*stale_flags = att[i].flags;
	}
	return 0;
}

/* Attach in mode (XDP_FLAGS_DRV_MODE / SKB_MODE), replacing or removing a stale program of
 * ours. 0 or -errno. */
static int attach_mode(struct pbox_xdp *x, uint32_t mode, uint32_t *stale_flags)
{
	int fd = pbox_xdp_prog_fd(x), rc;

	if (*stale_flags == mode) {
		/* Replace it in one step: the interface is never without a filter. */
		rc = bpf_xdp_attach(x->ifindex, fd, mode, NULL);
		if (rc == 0) {
			*stale_flags = 0;
		}
		return rc;
	}
	if (*stale_flags != 0) {
		/* Native and generic programs cannot coexist: the stale one goes first. */
		rc = bpf_xdp_detach(x->ifindex, *stale_flags, NULL);
		if (rc != 0) {
			PBOX_LOG_ERR(TRANSPORT, "%s: cannot detach the stale program: %s",
				     x->ifname, strerror(-rc));
			return rc;
		}
		*stale_flags = 0;
	}
	return bpf_xdp_attach(x->ifindex, fd, mode | XDP_FLAGS_UPDATE_IF_NOEXIST, NULL);
}

static int attach(struct pbox_xdp *x, enum pbox_xdp_mode mode)
{
	uint32_t stale;
	int rc;

	rc = find_stale(x, &stale);
	if (rc != 0) {
		return rc;
	}
	if (mode != PBOX_XDP_MODE_GENERIC) {
		rc = attach_mode(x, XDP_FLAGS_DRV_MODE, &stale);
		if (rc == 0) {
			x->attach_flags = XDP_FLAGS_DRV_MODE;
			return 0;
		}
		if (mode == PBOX_XDP_MODE_NATIVE) {
			PBOX_LOG_ERR(TRANSPORT,
				     "%s: cannot attach the XDP program in native mode: %s",
				     x->ifname, strerror(-rc));
			return rc;
		}
		PBOX_LOG_WARN(TRANSPORT,
			      "%s: native XDP not available (%s); using generic mode (slower: "
			      "after the kernel built an skb)",
			      x->ifname, strerror(-rc));
	}
	rc = attach_mode(x, XDP_FLAGS_SKB_MODE, &stale);
	if (rc != 0) {
		PBOX_LOG_ERR(TRANSPORT, "%s: cannot attach the XDP program in generic mode: %s",
			     x->ifname, strerror(-rc));
		return rc;
	}
	x->attach_flags = XDP_FLAGS_SKB_MODE;
	return 0;
}

struct pbox_xdp *pbox_xdp_open(const struct pbox_xdp_opts *o)
{
	const char *who = o->ifname != NULL ? o->ifname : "(not attached)";
	struct pbox_xdp *x;
	int rc;

	if (o->nports == 0 || (uint32_t)o->port_lo + o->nports > 65536) {
		PBOX_LOG_ERR(TRANSPORT, "%s: XDP: data ports %u + %u out of range", who, o->port_lo,
			     o->nports);
		return NULL;
	}
	libbpf_set_print(libbpf_print);
	x = calloc(1, sizeof(*x));
	if (x == NULL) {
		PBOX_LOG_ERR(TRANSPORT, "%s: XDP: out of memory", who);
		return NULL;
	}
	if (o->ifname != NULL) {
		snprintf(x->ifname, sizeof(x->ifname), "%s", o->ifname);
		x->ifindex = (int)if_nametoindex(o->ifname);
		if (x->ifindex == 0) {
			PBOX_LOG_ERR(TRANSPORT, "%s: XDP: no such interface: %s", o->ifname,
				     strerror(errno));
			free(x);
			return NULL;
		}
	}
	x->skel = pbox_xdp_bpf__open();
	if (x->skel == NULL) {
		PBOX_LOG_ERR(TRANSPORT, "%s: XDP: cannot open the program: %s", who,
			     strerror(errno));
		free(x);
		return NULL;
	}
	x->skel->rodata->port_lo = o->port_lo;
	x->skel->rodata->nports = o->nports;
	x->skel->rodata->data_addr = o->data_addr;
	x->max_chunks = o->max_chunks != 0 ? o->max_chunks : PBOX_XDP_DEFAULT_CHUNKS;
	x->max_chunks = (x->max_chunks + 7) & ~7u;
	bpf_map__set_max_entries(x->skel->maps.pbox_chunks, x->max_chunks / 8);
	rc = pbox_xdp_bpf__load(x->skel);
	if (rc != 0) {
		PBOX_LOG_ERR(TRANSPORT,
			     "%s: XDP: cannot load the program: %s (see libbpf's "
			     "messages above; BPF needs CAP_BPF and CAP_NET_ADMIN)",
			     who, strerror(-rc));
		goto fail;
	}
	/* An array's elements are laid out back to back (8 bytes each): byte i is slot i. */
	x->owners_len = x->max_chunks;
	x->owners = mmap(NULL, x->owners_len, PROT_READ | PROT_WRITE, MAP_SHARED,
			 bpf_map__fd(x->skel->maps.pbox_chunks), 0);
	if (x->owners == MAP_FAILED) {
		PBOX_LOG_ERR(TRANSPORT, "%s: XDP: cannot map the chunk-owner map: %s", who,
			     strerror(errno));
		x->owners = NULL;
		goto fail;
	}
	if (set_owner(x, who) != 0) {
		goto fail;
	}
	if (o->ifname == NULL) {
		return x;
	}
	rc = attach(x, o->mode);
	if (rc != 0) {
		x->ifindex = 0;
		goto fail;
	}
	if (o->pin_root == NULL || o->pin_root[0] != '\0') {
		pin_all(x, o->pin_root != NULL ? o->pin_root : DEFAULT_PIN_ROOT);
	}
	PBOX_LOG_INFO(TRANSPORT, "%s: XDP filter attached in %s mode (data ports %u-%u)", x->ifname,
		      pbox_xdp_attach_mode(x), o->port_lo, o->port_lo + o->nports - 1);
	return x;
fail:
	if (x->owners != NULL) {
		munmap(x->owners, x->owners_len);
	}
	pbox_xdp_bpf__destroy(x->skel);
	free(x);
	return NULL;
}

void pbox_xdp_close(struct pbox_xdp *x)
{
	if (x == NULL) {
		return;
	}
	if (x->ifindex != 0) {
		LIBBPF_OPTS(bpf_xdp_attach_opts, opts, .old_prog_fd = pbox_xdp_prog_fd(x));
		/* Only if the program there is still ours (a newer pboxd may have replaced it). */
		int rc = bpf_xdp_detach(x->ifindex, x->attach_flags | XDP_FLAGS_REPLACE, &opts);

		if (rc == -EEXIST) {
			PBOX_LOG_INFO(TRANSPORT,
				      "%s: the XDP program there is no longer ours (replaced by a "
				      "newer one): left attached",
				      x->ifname);
		} else if (rc != 0) {
			PBOX_LOG_WARN(TRANSPORT, "%s: XDP detach: %s", x->ifname, strerror(-rc));
		} else {
			PBOX_LOG_INFO(TRANSPORT, "%s: XDP filter detached", x->ifname);
		}
	}
	unpin_all(x);
	munmap(x->owners, x->owners_len);
	pbox_xdp_bpf__destroy(x->skel);
	for (uint32_t i = 0; i < x->njobs; i++) {
		free(x->jobs[i].cookies);
	}
	free(x->jobs);
	free(x);
}

static struct xdp_job *find_job(const struct pbox_xdp *x, uint32_t id)
{
	for (uint32_t i = 0; i < x->njobs; i++) {
		if (x->jobs[i].id == id) {
			return &x->jobs[i];
		}
	}
	return NULL;
}

int pbox_xdp_job_known(const struct pbox_xdp *x, uint32_t job)
{
	return find_job(x, job) != NULL;
}

static int cookie_write(struct pbox_xdp *x, uint32_t job, uint32_t rank, uint64_t cookie)
{
	struct pbox_xdp_rank_key k = { .job = job, .rank = rank };
	int fd = bpf_map__fd(x->skel->maps.pbox_cookies), rc;

	if (cookie != 0) {
		rc = bpf_map_update_elem(fd, &k, &cookie, BPF_ANY);
	} else {
		rc = bpf_map_delete_elem(fd, &k);
		if (rc != 0 && errno == ENOENT) {
			rc = 0;
		}
	}
	return rc != 0 ? -errno : 0;
}

/* Write j's entry of pbox_jobs from the shadow. 0 or -errno (logged). */
static int job_write(struct pbox_xdp *x, const struct xdp_job *j)
{
	struct pbox_xdp_job v = { .nworkers = j->nworkers,
				  .nchunks = j->nchunks,
				  .chunk_base = j->chunk_base };

	if (bpf_map_update_elem(bpf_map__fd(x->skel->maps.pbox_jobs), &j->id, &v, BPF_ANY) != 0) {
		int rc = -errno;

		PBOX_LOG_ERR(TRANSPORT, "%s: XDP: job %u: job map update: %s", x->ifname, j->id,
			     strerror(errno));
		return rc;
	}
	return 0;
}

int pbox_xdp_job_set(struct pbox_xdp *x, uint32_t job, uint32_t nworkers, const uint64_t *cookies)
{
	struct xdp_job *j = find_job(x, job);
	uint64_t *shadow;
	int rc = 0;

	if (j == NULL) {
		if (x->njobs == x->cap_jobs) {
			uint32_t cap = x->cap_jobs ? 2 * x->cap_jobs : 8;
			struct xdp_job *n = realloc(x->jobs, cap * sizeof(*n));

			if (n == NULL) {
				return -ENOMEM;
			}
			x->jobs = n;
			x->cap_jobs = cap;
		}
		shadow = calloc(nworkers ? nworkers : 1, sizeof(*shadow));
		if (shadow == NULL) {
			return -ENOMEM;
		}
		j = &x->jobs[x->njobs++];
		*j = (struct xdp_job){ .id = job, .nworkers = nworkers, .cookies = shadow };
	} else if (j->nworkers != nworkers) {
		/* A new geometry (a new session of the same job): start from scratch. */
		pbox_xdp_job_remove(x, job);
		return pbox_xdp_job_set(x, job, nworkers, cookies);
	}
	for (uint32_t r = 0; r < nworkers; r++) {
		if (j->cookies[r] == cookies[r]) {
			continue;
		}
		rc = cookie_write(x, job, r, cookies[r]);
		if (rc != 0) {
			PBOX_LOG_ERR(TRANSPORT, "%s: XDP: job %u rank %u: cookie update: %s",
				     x->ifname, job, r, strerror(-rc));
			return rc;
		}
		j->cookies[r] = cookies[r];
	}
	return job_write(x, j);
}

/* The first slot of a free run of n slots of pbox_chunks (first fit between the jobs'
 * runs), or UINT32_MAX. */
static uint32_t slots_find(const struct pbox_xdp *x, uint32_t n)
{
	uint32_t base = 0;

	for (;;) {
		bool moved = false;

		if ((uint64_t)base + n > x->max_chunks) {
			return UINT32_MAX;
		}
		for (uint32_t i = 0; i < x->njobs; i++) {
			const struct xdp_job *j = &x->jobs[i];

			/* Overlaps [base, base + n): try after it. */
			if (j->nchunks != 0 && j->chunk_base < base + n &&
			    base < j->chunk_base + j->nchunks) {
				base = j->chunk_base + j->nchunks;
				moved = true;
			}
		}
		if (!moved) {
			return base;
		}
	}
}

int pbox_xdp_chunks_set(struct pbox_xdp *x, uint32_t job, const uint32_t *core, uint32_t nchunks)
{
	struct xdp_job *j = find_job(x, job);
	uint32_t base;
	int rc;

	if (j == NULL) {
		return -ENOENT;
	}
	for (uint32_t c = 0; c < nchunks; c++) {
		if (core[c] >= PBOX_XDP_MAX_CORES) {
			return -EINVAL;
		}
	}
	/* Unreachable first; then its slots may be reused. */
	if (j->nchunks != 0) {
		j->nchunks = 0;
		rc = job_write(x, j);
		if (rc != 0) {
			return rc;
		}
	}
	if (nchunks == 0) {
		return 0;
	}
	base = slots_find(x, nchunks);
	if (base == UINT32_MAX) {
		PBOX_LOG_WARN(TRANSPORT,
			      "%s: XDP: job %u: no room for its %u chunks in the chunk-owner map "
			      "(%u slots: xdp.max_chunks); its datagrams go to the kernel "
			      "(pass_no_owner)",
			      x->ifname, job, nchunks, x->max_chunks);
		return -ENOSPC;
	}
	/* Plain stores into the mapped array; the job entry's update (a system call, so a
	 * full barrier) then makes them reachable. */
	for (uint32_t c = 0; c < nchunks; c++) {
		x->owners[base + c] = (uint8_t)core[c];
	}
	j->chunk_base = base;
	j->nchunks = nchunks;
	rc = job_write(x, j);
	if (rc != 0) {
		j->nchunks = 0;
	}
	return rc;
}

int pbox_xdp_job_remove(struct pbox_xdp *x, uint32_t job)
{
	struct xdp_job *j = find_job(x, job);

	if (j == NULL) {
		return 0;
	}
	/* The job first: from here on its datagrams are unknown_job, whatever the rest. */
	if (bpf_map_delete_elem(bpf_map__fd(x->skel->maps.pbox_jobs), &job) != 0 &&
	    errno != ENOENT) {
		PBOX_LOG_ERR(TRANSPORT, "%s: XDP: job %u: job map delete: %s", x->ifname, job,
			     strerror(errno));
	}
	for (uint32_t r = 0; r < j->nworkers; r++) {
		if (j->cookies[r] != 0) {
			cookie_write(x, job, r, 0);
		}
	}
	/* Its chunk slots are free once the entry is gone (nothing to write). */
	free(j->cookies);
	*j = x->jobs[--x->njobs];
	return 0;
}

int pbox_xdp_xsk_set(struct pbox_xdp *x, uint32_t core, uint32_t rxq, int xsk_fd)
{
	uint32_t slot = pbox_xdp_xsk_slot(core, rxq);

	if (core >= PBOX_XDP_MAX_CORES || rxq >= PBOX_XDP_MAX_RXQ || xsk_fd < 0) {
		return -EINVAL;
	}
	if (bpf_map_update_elem(bpf_map__fd(x->skel->maps.pbox_xsks), &slot, &xsk_fd, BPF_ANY) !=
	    0) {
		int rc = -errno;

		PBOX_LOG_ERR(TRANSPORT, "%s: XDP: core %u rx queue %u: XSK map update: %s",
			     x->ifname, core, rxq, strerror(errno));
		return rc;
	}
	return 0;
}

int pbox_xdp_xsk_clear(struct pbox_xdp *x, uint32_t core, uint32_t rxq)
{
	uint32_t slot = pbox_xdp_xsk_slot(core, rxq);

	if (core >= PBOX_XDP_MAX_CORES || rxq >= PBOX_XDP_MAX_RXQ) {
		return -EINVAL;
	}
	if (bpf_map_delete_elem(bpf_map__fd(x->skel->maps.pbox_xsks), &slot) != 0 &&
	    errno != ENOENT) {
		return -errno;
	}
	return 0;
}

int pbox_xdp_stats_read(const struct pbox_xdp *x, struct pbox_xdp_stats *sum)
{
	int ncpu = libbpf_num_possible_cpus();
	struct pbox_xdp_stats *v;
	uint32_t key = 0;
	int rc = 0;

	_Static_assert(sizeof(struct pbox_xdp_stats) % 8 == 0, "per-CPU values are 8-aligned");
	if (ncpu <= 0) {
		return ncpu < 0 ? ncpu : -EINVAL;
	}
	v = calloc((size_t)ncpu, sizeof(*v));
	if (v == NULL) {
		return -ENOMEM;
	}
	memset(sum, 0, sizeof(*sum));
	if (bpf_map_lookup_elem(bpf_map__fd(x->skel->maps.pbox_stats), &key, v) != 0) {
		rc = -errno;
	} else {
		for (int c = 0; c < ncpu; c++) {
			const uint64_t *in = (const uint64_t *)&v[c];
			uint64_t *out = (uint64_t *)sum;

			for (size_t i = 0; i < sizeof(*sum) / 8; i++) {
				out[i] += in[i];
			}
		}
	}
	free(v);
	return rc;
}
