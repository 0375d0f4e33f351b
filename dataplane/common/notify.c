/* SPDX-License-Identifier: BSD-3-Clause */
/* Service-manager notification: sd_notify(3) when built with libsystemd (see notify.h). */
#include "notify.h"

#include <stdarg.h>
#include <stdio.h>

#ifdef PBOX_HAVE_SYSTEMD
#include <systemd/sd-daemon.h>
#endif

void pbox_notify(const char *state)
{
#ifdef PBOX_HAVE_SYSTEMD
	(void)sd_notify(0, state);
#else
	(void)state;
#endif
}

void pbox_notifyf(const char *fmt, ...)
{
	char buf[1024];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(buf, sizeof(buf), fmt, ap);
	va_end(ap);
	pbox_notify(buf);
}
