/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * pbox-udp-flood: send COUNT garbage datagrams to pboxd's data ports as fast as sendmmsg
 * allows, for the hostile-client integration test. Datagrams cycle through kinds that the
 * appliance must drop: random bytes of random length, and 64-byte pbox headers with the
 * right magic and version but the given job id and a random cookie (so they get as far as
 * the cookie check). Prints "sent N datagrams in S s".
 *
 *   pbox-udp-flood HOST BASE_PORT NPORTS COUNT JOB SEED
 *
 * Exit status 0, or 1 with the reason on stderr (bad arguments, socket errors other than a
 * full buffer).
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define BATCH   64
#define MAX_LEN 1400

static uint64_t g_rng;

static uint64_t next_rand(void)
{
	/* xorshift64*: reproducible garbage for a given seed. */
	g_rng ^= g_rng >> 12;
	g_rng ^= g_rng << 25;
	g_rng ^= g_rng >> 27;
	return g_rng * 2685821657736338717ull;
}

static unsigned fill(uint8_t *p, uint64_t i, uint32_t job)
{
	unsigned len;

	if (i % 2 == 0) {
		len = (unsigned)(next_rand() % MAX_LEN);
		for (unsigned k = 0; k < len; k++) {
			p[k] = (uint8_t)next_rand();
		}
		return len;
	}
	/* A pbox header (big-endian, see common/wire.h): magic "PBOX", version 1, PUSH, the
	 * job id, a random sender and cookie; the rest random. */
	len = 64 + (unsigned)(next_rand() % 64);
	for (unsigned k = 0; k < len; k++) {
		p[k] = (uint8_t)next_rand();
	}
	memcpy(p, "PBOX", 4);
	p[4] = 1;
	p[5] = 1;
	p[8] = (uint8_t)(job >> 24);
	p[9] = (uint8_t)(job >> 16);
	p[10] = (uint8_t)(job >> 8);
	p[11] = (uint8_t)job;
	return len;
}

int main(int argc, char **argv)
{
	static uint8_t bufs[BATCH][MAX_LEN];
	struct mmsghdr msgs[BATCH];
	struct iovec iov[BATCH];
	struct sockaddr_in dst[BATCH];
	struct sockaddr_in base = { .sin_family = AF_INET };
	unsigned long port, nports, job;
	unsigned long long count, sent = 0;
	struct timespec t0, t1;
	int fd;

	if (argc != 7 || inet_pton(AF_INET, argv[1], &base.sin_addr) != 1) {
		fprintf(stderr, "usage: pbox-udp-flood HOST BASE_PORT NPORTS COUNT JOB SEED\n");
		return 1;
	}
	port = strtoul(argv[2], NULL, 10);
	nports = strtoul(argv[3], NULL, 10);
	count = strtoull(argv[4], NULL, 10);
	job = strtoul(argv[5], NULL, 10);
	g_rng = strtoull(argv[6], NULL, 10) | 1;
	if (port == 0 || port > 65535 || nports == 0 || port + nports > 65536) {
		fprintf(stderr, "pbox-udp-flood: bad ports %s + %s\n", argv[2], argv[3]);
		return 1;
	}
	fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
	if (fd < 0) {
		perror("pbox-udp-flood: socket");
		return 1;
	}
	clock_gettime(CLOCK_MONOTONIC, &t0);
	while (sent < count) {
		unsigned n = count - sent < BATCH ? (unsigned)(count - sent) : BATCH;
		int rc;

		for (unsigned k = 0; k < n; k++) {
			uint64_t i = sent + k;

			dst[k] = base;
			dst[k].sin_port = htons((uint16_t)(port + i % nports));
			iov[k].iov_base = bufs[k];
			iov[k].iov_len = fill(bufs[k], i, (uint32_t)job);
			memset(&msgs[k], 0, sizeof(msgs[k]));
			msgs[k].msg_hdr.msg_name = &dst[k];
			msgs[k].msg_hdr.msg_namelen = sizeof(dst[k]);
			msgs[k].msg_hdr.msg_iov = &iov[k];
			msgs[k].msg_hdr.msg_iovlen = 1;
		}
		rc = sendmmsg(fd, msgs, n, 0);
		if (rc < 0) {
			if (errno == EINTR || errno == ENOBUFS || errno == EAGAIN ||
			    errno == ECONNREFUSED) {
				sent += n; /* counted as sent: lost like on a congested link */
				continue;
			}
			perror("pbox-udp-flood: sendmmsg");
			close(fd);
			return 1;
		}
		sent += rc > 0 ? (unsigned)rc : 1u;
	}
	clock_gettime(CLOCK_MONOTONIC, &t1);
	printf("sent %llu datagrams in %.2f s\n", sent,
	       (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9);
	close(fd);
	return 0;
}
