/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Internal glue between libpbox's client (client*.c) and the broadcast-update API
 * (update.c, pbox_update_* in pbox/pbox.h). Not installed.
 */
#ifndef PBOX_LIBPBOX_UPDATE_H
#define PBOX_LIBPBOX_UPDATE_H

#include <stddef.h>

#include <jansson.h>

#include <pbox/pbox.h>

#include "common/compiler.h"
#include "common/jobdesc.h"
#include "kernels/kernels.h"

/*
 * Read the "optimizer" object of a broadcast job's hello reply ({"name": .., "lr": ..,
 * "momentum", "wd", "rescale", "clip", "beta1", "beta2", "eps"}; each float as a double
 * that rounds back exactly). Returns 0, or -EPROTO with why (the member at fault).
 */
int pbox_update_parse_optimizer(const json_t *o, const struct pbox_optimizer_ops **opt,
				struct pbox_opt_params *params, char *why, size_t whylen);

/* client_ops.c: the job's optimizer and the registered keys of a registered broadcast job;
 * -ENOTCONN (not registered) or -EINVAL (another mode), with pbox_last_error() set. */
int pbox_client_update_cfg(const struct pbox_client *c, const struct pbox_optimizer_ops **opt,
			   struct pbox_opt_params *params, const struct pbox_jobdesc **desc);

/* client.c: set pbox_last_error() of this thread; returns err. */
int pbox_client_error(int err, const char *fmt, ...) PBOX_PRINTF(2, 3);

#endif /* PBOX_LIBPBOX_UPDATE_H */
