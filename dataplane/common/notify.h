/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Service-manager notification (systemd's sd_notify protocol) for the daemons, pboxd and
 * pbox-ctrld: READY=1 once they serve, STATUS=..., STOPPING=1 when they stop.
 *
 * Built with libsystemd (meson option systemd, PBOX_HAVE_SYSTEMD), these call
 * sd_notify(3); without it they do nothing, so a Type=notify unit needs a build with
 * libsystemd (Type=simple works with either). Nothing is sent unless the process was
 * started with NOTIFY_SOCKET (by systemd), so a daemon run by hand is unaffected.
 *
 * Errors: none reported; a notification that cannot be sent is not a daemon's failure
 * (systemd then times the unit out and says so). Thread safety: callable from any thread.
 */
#ifndef PBOX_NOTIFY_H
#define PBOX_NOTIFY_H

/* Send state ("READY=1\nSTATUS=..."), newline-separated assignments. */
void pbox_notify(const char *state);

/* pbox_notify with a printf format. */
void pbox_notifyf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

#endif /* PBOX_NOTIFY_H */
