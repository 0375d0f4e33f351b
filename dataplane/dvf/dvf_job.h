/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * A job's DVF settings (struct pbox_dvf_job, dvf.h) in the two forms they travel in:
 * the `dvf` group of a job's definition (pboxd's configuration file, or a runtime job's
 * JSON description turned into the same group) and the "dvf" object of pboxd's answer
 * to a worker's register request.
 *
 *   dvf = {
 *     low = 2.0;            # delta_low: threshold numerator on sufficient links
 *     up = 8.0;             # delta_up (>= low): on insufficient links
 *     codec = "snappy";     # none, lz4, zstd[:1..3], snappy, igzip[:0..3]
 *     link = "sufficient";  # the link state until the control plane's plan says
 *                           # otherwise ("insufficient": delta_up from the start)
 *     sparse = 0.8;         # sparse blocks above this sparsity (PF: 0.8; 0.5..1)
 *     bitmap = true;        # other blocks: values + presence bitmap (false: PF's dense)
 *   };
 *
 * Thread safety: pure functions over the caller's data.
 */
#ifndef PBOX_DVF_JOB_H
#define PBOX_DVF_JOB_H

#include <stddef.h>

#include <jansson.h>

#include "dvf.h"

/* Default thresholds, in the units of the values pushed: calibrated on the demo's MLP
 * (gradients summed over a worker's share of a 240-sample batch), where delta_low drops
 * about 60 % of the pushed values and delta_up about 90 % (Parameter Flow: 40-60 % and
 * 60-80 %), both without losing test accuracy (README, "DVF on the wire"). Other models
 * need their own: the filter compares magnitudes. */
#define PBOX_DVF_DEFAULT_LOW 2.0f
#define PBOX_DVF_DEFAULT_UP  8.0f

/* The settings a `dvf` group without members gives (enabled). */
void pbox_dvf_job_default(struct pbox_dvf_job *j);

/* The JSON object of pboxd's register answer. New reference, NULL if out of memory. */
json_t *pbox_dvf_job_to_json(const struct pbox_dvf_job *j);

/*
 * Decode that object (untrusted: from the control channel) into *j (enabled). 0, or
 * -EPROTO with a message in err (a member missing or out of range, an unknown codec or
 * link).
 */
int pbox_dvf_job_from_json(const json_t *o, struct pbox_dvf_job *j, char *err, size_t errlen);

/*
 * The link state the appliance filters a job's broadcasts with, from the control plane's
 * plan ({"thresholds": {"broadcast": {"select": "delta_low" | "delta_up"}}}: PF's rule,
 * delta_up when some link of the job is insufficient): dflt (the job's own `link`) when
 * plan is NULL or does not say.
 */
enum pbox_dvf_link pbox_dvf_plan_broadcast_link(const json_t *plan, enum pbox_dvf_link dflt);

#endif /* PBOX_DVF_JOB_H */
