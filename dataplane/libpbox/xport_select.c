/* SPDX-License-Identifier: BSD-3-Clause */
/* The worker's choice of data path (see xport_select.h). */
#include "xport_select.h"

#include <arpa/inet.h>
#include <errno.h>
#include <ifaddrs.h>
#include <netinet/in.h>
#include <stdio.h>
#include <string.h>

int pbox_xsel_parse(const char *s, enum pbox_xsel_mode *out)
{
	if (s == NULL || s[0] == '\0' || strcmp(s, "auto") == 0) {
		*out = PBOX_XSEL_AUTO;
	} else if (strcmp(s, "udp") == 0) {
		*out = PBOX_XSEL_UDP;
	} else if (strcmp(s, "shm") == 0) {
		*out = PBOX_XSEL_SHM;
	} else {
		return -EINVAL;
	}
	return 0;
}

bool pbox_xsel_addr_is_local(const char *addr)
{
	struct in_addr a;
	struct ifaddrs *ifa, *i;
	bool local = false;

	if (inet_pton(AF_INET, addr, &a) != 1) {
		return false;
	}
	if ((ntohl(a.s_addr) >> 24) == 127) {
		return true;
	}
	if (getifaddrs(&ifa) != 0) {
		return false;
	}
	for (i = ifa; i != NULL && !local; i = i->ifa_next) {
		if (i->ifa_addr != NULL && i->ifa_addr->sa_family == AF_INET &&
		    ((const struct sockaddr_in *)(const void *)i->ifa_addr)->sin_addr.s_addr ==
			    a.s_addr) {
			local = true;
		}
	}
	freeifaddrs(ifa);
	return local;
}

bool pbox_xsel_want_shm(enum pbox_xsel_mode mode, const char *advertised, const char *data_addr,
			bool fault, char *why, size_t whylen)
{
	const char *no = NULL;

	if (mode == PBOX_XSEL_UDP) {
		no = "udp was asked for";
	} else if (advertised == NULL || advertised[0] == '\0') {
		no = "pboxd offers no shared memory";
	} else if (mode == PBOX_XSEL_SHM) {
		no = NULL; /* forced: try it wherever pboxd is */
	} else if (fault) {
		no = "fault injection is on (a UDP feature)";
	} else if (!pbox_xsel_addr_is_local(data_addr)) {
		no = "pboxd's data address is not on this host";
	}
	if (no != NULL && why != NULL) {
		snprintf(why, whylen, "%s", no);
	}
	return no == NULL;
}
