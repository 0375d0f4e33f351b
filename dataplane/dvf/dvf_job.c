/* SPDX-License-Identifier: BSD-3-Clause */
/* A job's DVF settings as JSON (see dvf_job.h). */
#include "dvf_job.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

void pbox_dvf_job_default(struct pbox_dvf_job *j)
{
	memset(j, 0, sizeof(*j));
	j->enabled = true;
	j->params.delta_low = PBOX_DVF_DEFAULT_LOW;
	j->params.delta_up = PBOX_DVF_DEFAULT_UP;
	j->link = PBOX_DVF_LINK_SUFFICIENT;
	pbox_dvf_enc_cfg_default(&j->enc);
}

json_t *pbox_dvf_job_to_json(const struct pbox_dvf_job *j)
{
	char codec[32];

	snprintf(codec, sizeof(codec), "%s:%d", j->enc.codec ? j->enc.codec->name : "none",
		 j->enc.codec ? j->enc.level : 0);
	return json_pack("{s:f, s:f, s:s, s:s, s:i, s:b}", "low", (double)j->params.delta_low, "up",
			 (double)j->params.delta_up, "codec", codec, "link",
			 j->link == PBOX_DVF_LINK_SUFFICIENT ? "sufficient" : "insufficient",
			 "sparse_permille", (json_int_t)j->enc.sparse_permille, "bitmap",
			 j->enc.dense_bitmap);
}

enum pbox_dvf_link pbox_dvf_plan_broadcast_link(const json_t *plan, enum pbox_dvf_link dflt)
{
	const char *sel = json_string_value(json_object_get(
		json_object_get(json_object_get(plan, "thresholds"), "broadcast"), "select"));

	if (sel != NULL && strcmp(sel, "delta_up") == 0) {
		return PBOX_DVF_LINK_INSUFFICIENT;
	}
	if (sel != NULL && strcmp(sel, "delta_low") == 0) {
		return PBOX_DVF_LINK_SUFFICIENT;
	}
	return dflt;
}

int pbox_dvf_job_from_json(const json_t *o, struct pbox_dvf_job *j, char *err, size_t errlen)
{
	const json_t *low = json_object_get(o, "low"), *up = json_object_get(o, "up");
	const json_t *sp = json_object_get(o, "sparse_permille");
	const char *codec = json_string_value(json_object_get(o, "codec"));
	const char *link = json_string_value(json_object_get(o, "link"));
	const json_t *bm = json_object_get(o, "bitmap");

	pbox_dvf_job_default(j);
	if (!json_is_object(o) || !json_is_number(low) || !json_is_number(up) ||
	    !json_is_integer(sp) || codec == NULL || link == NULL || !json_is_boolean(bm)) {
		snprintf(err, errlen,
			 "dvf: expected {low, up, codec, link, sparse_permille, bitmap}");
		return -EPROTO;
	}
	j->params.delta_low = (float)json_number_value(low);
	j->params.delta_up = (float)json_number_value(up);
	if (pbox_dvf_params_check(&j->params) != 0) {
		snprintf(err, errlen, "dvf: bad thresholds low %g up %g", json_number_value(low),
			 json_number_value(up));
		return -EPROTO;
	}
	if (pbox_dvf_codec_parse(codec, &j->enc.codec, &j->enc.level) != 0) {
		snprintf(err, errlen, "dvf: unknown codec '%s' (%s)", codec,
			 pbox_dvf_codec_names());
		return -EPROTO;
	}
	if (strcmp(link, "sufficient") == 0) {
		j->link = PBOX_DVF_LINK_SUFFICIENT;
	} else if (strcmp(link, "insufficient") == 0) {
		j->link = PBOX_DVF_LINK_INSUFFICIENT;
	} else {
		snprintf(err, errlen, "dvf: unknown link state '%s'", link);
		return -EPROTO;
	}
	if (json_integer_value(sp) < 500 || json_integer_value(sp) > 1000) {
		snprintf(err, errlen, "dvf: sparse_permille %lld outside 500..1000",
			 (long long)json_integer_value(sp));
		return -EPROTO;
	}
	j->enc.sparse_permille = (uint32_t)json_integer_value(sp);
	j->enc.dense_bitmap = json_is_true(bm);
	if (pbox_dvf_enc_cfg_check(&j->enc) != 0) {
		snprintf(err, errlen, "dvf: codec '%s' refused its settings", codec);
		return -EPROTO;
	}
	return 0;
}
