/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The SLoPS estimator (see slops.h): trend tests, stream and fleet verdicts, and the rate
 * search. No I/O, no clock: unit tests drive it with synthetic delay series.
 */
#include <errno.h>
#include <math.h>
#include <string.h>

#include "slops.h"

const char *pbox_slops_verdict_name(enum pbox_slops_verdict v)
{
	switch (v) {
	case PBOX_SLOPS_NOTREND:
		return "notrend";
	case PBOX_SLOPS_INCREASING:
		return "increasing";
	case PBOX_SLOPS_GREY:
		return "grey";
	case PBOX_SLOPS_LOSSY:
		return "lossy";
	case PBOX_SLOPS_DISTURBED:
		return "disturbed";
	case PBOX_SLOPS_SHORT:
		return "short";
	}
	return "unknown";
}

/* Median of x[0..n), n <= 32 (a group of at most floor(sqrt(400)) = 20 delays). */
static int64_t median_small(const int64_t *x, size_t n)
{
	int64_t v[32];
	size_t i, j;

	for (i = 0; i < n; i++) {
		int64_t t = x[i];

		for (j = i; j > 0 && v[j - 1] > t; j--) {
			v[j] = v[j - 1];
		}
		v[j] = t;
	}
	if (n % 2) {
		return v[n / 2];
	}
	/* The lower of the two middles plus half the gap, without overflow: the gap is exact
	 * in the unsigned type (v[n/2] >= v[n/2-1]) and half of it fits an int64_t. */
	return v[n / 2 - 1] + (int64_t)(((uint64_t)v[n / 2] - (uint64_t)v[n / 2 - 1]) / 2);
}

void pbox_slops_trend(const int64_t *x, size_t n, double *pct, double *pdt)
{
	int64_t med[PBOX_SLOPS_MAX_STREAM_LEN];
	size_t group, groups, k, up = 0;
	double net, total = 0;

	*pct = -1;
	*pdt = 0;
	if (n < 10) {
		return;
	}
	if (n > PBOX_SLOPS_MAX_STREAM_LEN) {
		n = PBOX_SLOPS_MAX_STREAM_LEN;
	}
	group = (size_t)sqrt((double)n);
	groups = n / group; /* a partial last group is dropped, as pathload does */
	for (k = 0; k < groups; k++) {
		med[k] = median_small(x + k * group, group);
	}
	for (k = 1; k < groups; k++) {
		/* Delays from a peer may be any value: differences taken modulo 2^64 (exact
		 * for real delays, defined for garbage), as the clocks themselves are. */
		double d = (double)(int64_t)((uint64_t)med[k] - (uint64_t)med[k - 1]);

		up += med[k] > med[k - 1];
		total += fabs(d);
	}
	net = (double)(int64_t)((uint64_t)med[groups - 1] - (uint64_t)med[0]);
	*pct = (double)up / (double)(groups - 1);
	*pdt = total > 0 ? net / total : 0;
}

/* a - b, saturated to the int64_t range (timestamps come from a peer: any value). */
static int64_t sat_sub(int64_t a, int64_t b)
{
	int64_t r;

	if (__builtin_sub_overflow(a, b, &r)) {
		return a < 0 ? INT64_MIN : INT64_MAX;
	}
	return r;
}

int pbox_slops_stream_analyze(const int64_t *send_ns, const int64_t *recv_ns, const uint8_t *got,
			      uint32_t count, int64_t period_ns,
			      struct pbox_slops_stream_stats *out)
{
	int64_t owd[PBOX_SLOPS_MAX_STREAM_LEN];
	int64_t rx_min = INT64_MAX, rx_max = INT64_MIN, rel;
	uint32_t i, first = 0, last = 0, n = 0;

	if (count == 0 || count > PBOX_SLOPS_MAX_STREAM_LEN || period_ns <= 0 ||
	    period_ns > INT64_MAX / PBOX_SLOPS_MAX_STREAM_LEN) {
		return -EINVAL;
	}
	memset(out, 0, sizeof(*out));
	out->count = count;
	out->duration_ns = (int64_t)(count - 1) * period_ns;
	for (i = 0; i < count; i++) {
		if (!got[i]) {
			continue;
		}
		if (n == 0) {
			first = i;
		}
		last = i;
		/* Differences of 64-bit clocks: wrap-around is defined for the unsigned type
		 * and the offset between the clocks cancels in the trend. */
		owd[n++] = (int64_t)((uint64_t)recv_ns[i] - (uint64_t)send_ns[i]);
		/* Arrival times relative to the first one's, so a wrapping clock works too. */
		rel = (int64_t)((uint64_t)recv_ns[i] - (uint64_t)recv_ns[first]);
		rx_min = rel < rx_min ? rel : rx_min;
		rx_max = rel > rx_max ? rel : rx_max;
	}
	out->received = n;
	if (n >= 2) {
		out->send_excess_ns =
			sat_sub((int64_t)((uint64_t)send_ns[last] - (uint64_t)send_ns[first]),
				(int64_t)(last - first) * period_ns);
		out->rx_span_ns = sat_sub(rx_max, rx_min);
	}
	pbox_slops_trend(owd, n, &out->pct, &out->pdt);
	return 0;
}

/* One test against its threshold with the unclear band around it. */
static enum pbox_slops_verdict test_verdict(double x, double threshold)
{
	if (x > threshold * (1 + PBOX_SLOPS_UNCLEAR)) {
		return PBOX_SLOPS_INCREASING;
	}
	if (x < threshold * (1 - PBOX_SLOPS_UNCLEAR)) {
		return PBOX_SLOPS_NOTREND;
	}
	return PBOX_SLOPS_GREY;
}

enum pbox_slops_verdict pbox_slops_stream_verdict(const struct pbox_slops_stream_stats *st)
{
	enum pbox_slops_verdict a, b;
	uint32_t min_len;

	if (st->count == 0 || st->received == 0) {
		return st->count ? PBOX_SLOPS_LOSSY : PBOX_SLOPS_SHORT;
	}
	if ((double)(st->count - st->received) > PBOX_SLOPS_HIGH_LOSS * st->count) {
		return PBOX_SLOPS_LOSSY;
	}
	min_len = st->count < PBOX_SLOPS_MIN_STREAM_LEN ? st->count : PBOX_SLOPS_MIN_STREAM_LEN;
	if (st->received < min_len || st->pct < 0) {
		return PBOX_SLOPS_SHORT;
	}
	if ((double)st->send_excess_ns > PBOX_SLOPS_MAX_DISTURBED * (double)st->duration_ns) {
		return PBOX_SLOPS_DISTURBED;
	}
	a = test_verdict(st->pct, PBOX_SLOPS_PCT_THRESHOLD);
	b = test_verdict(st->pdt, PBOX_SLOPS_PDT_THRESHOLD);
	if (a == b) {
		return a;
	}
	/* One test unclear: the other decides. The two contradicting each other: unclear. */
	if (a == PBOX_SLOPS_GREY) {
		return b;
	}
	if (b == PBOX_SLOPS_GREY) {
		return a;
	}
	return PBOX_SLOPS_GREY;
}

enum pbox_slops_verdict pbox_slops_fleet_verdict(const enum pbox_slops_verdict *v, size_t n)
{
	size_t i, inc = 0, not = 0, grey = 0, lossy = 0, usable;

	for (i = 0; i < n; i++) {
		inc += v[i] == PBOX_SLOPS_INCREASING;
		not += v[i] == PBOX_SLOPS_NOTREND;
		grey += v[i] == PBOX_SLOPS_GREY;
		lossy += v[i] == PBOX_SLOPS_LOSSY;
	}
	if (n > 0 && (double)lossy > PBOX_SLOPS_MAX_LOSSY * (double)n) {
		return PBOX_SLOPS_INCREASING; /* queues overflow: R > A */
	}
	usable = inc + not +grey;
	if (n == 0 || 2 * usable < n) {
		return PBOX_SLOPS_DISTURBED;
	}
	if ((double)inc >= PBOX_SLOPS_AGREEMENT * (double)usable) {
		return PBOX_SLOPS_INCREASING;
	}
	if ((double)not >= PBOX_SLOPS_AGREEMENT * (double)usable) {
		return PBOX_SLOPS_NOTREND;
	}
	return PBOX_SLOPS_GREY;
}

uint32_t pbox_slops_packet_bytes(double bps, uint32_t max_bytes, uint32_t count, int64_t *period_ns)
{
	double bytes = max_bytes, dur;

	if (max_bytes < PBOX_SLOPS_MIN_PACKET) {
		max_bytes = PBOX_SLOPS_MIN_PACKET;
		bytes = max_bytes;
	}
	count = count < 2 ? 2 : count;
	dur = bytes * 8 / bps * 1e9 * (count - 1);
	if (dur > PBOX_SLOPS_MAX_STREAM_NS) {
		bytes = bps * PBOX_SLOPS_MAX_STREAM_NS / 8e9 / (count - 1);
		bytes = bytes < PBOX_SLOPS_MIN_PACKET ? PBOX_SLOPS_MIN_PACKET : bytes;
	}
	*period_ns = (int64_t)ceil(floor(bytes) * 8e9 / bps);
	return (uint32_t)bytes;
}

bool pbox_slops_fleet_decided(const enum pbox_slops_verdict *v, size_t done, size_t total,
			      enum pbox_slops_verdict *out)
{
	static const enum pbox_slops_verdict fill[] = { PBOX_SLOPS_INCREASING, PBOX_SLOPS_NOTREND,
							PBOX_SLOPS_GREY, PBOX_SLOPS_LOSSY,
							PBOX_SLOPS_SHORT };
	enum pbox_slops_verdict tmp[PBOX_SLOPS_MAX_FLEET_STREAMS], first = PBOX_SLOPS_GREY;
	size_t f, i;

	if (total == 0 || total > PBOX_SLOPS_MAX_FLEET_STREAMS || done > total) {
		return false;
	}
	memcpy(tmp, v, done * sizeof(*v));
	/* The fleet verdict is monotone in each kind of remaining stream, so the remaining
	 * streams all of one kind are the extreme cases: if these agree, any mix does. */
	for (f = 0; f < sizeof(fill) / sizeof(fill[0]); f++) {
		enum pbox_slops_verdict r;

		for (i = done; i < total; i++) {
			tmp[i] = fill[f];
		}
		r = pbox_slops_fleet_verdict(tmp, total);
		if (f == 0) {
			first = r;
		} else if (r != first) {
			return false;
		}
	}
	*out = first;
	return true;
}

int pbox_slops_search_init(struct pbox_slops_search *s, double min_bps, double cap_bps, double res)
{
	if (!(min_bps > 0) || !(cap_bps > min_bps) || !(res > 0 && res < 1)) {
		return -EINVAL;
	}
	memset(s, 0, sizeof(*s));
	s->min_bps = min_bps;
	s->cap_bps = cap_bps;
	s->resolution = res;
	s->lo = min_bps;
	s->hi = cap_bps;
	s->grey_lo = cap_bps * 2; /* none */
	s->grey_hi = 0;
	return 0;
}

void pbox_slops_search_hint(struct pbox_slops_search *s, double bps)
{
	if (s->fleets > 0 || !(bps > 0)) {
		return;
	}
	s->next = bps < s->min_bps ? s->min_bps : bps > s->cap_bps ? s->cap_bps : bps;
	s->hint = true;
}

static bool have_grey(const struct pbox_slops_search *s)
{
	return s->grey_lo <= s->grey_hi;
}

/* The probe between a and b: geometric while the bracket spans more than a factor 4 (it
 * halves the ratio, which is what a relative resolution needs), arithmetic after. */
static double midpoint(double a, double b)
{
	return b > 4 * a ? sqrt(a * b) : (a + b) / 2;
}

/* The next probe in (a, b). A hint changes the bisection where one side is still open:
 * - nothing was below A yet (no NOTREND): halve b first. A dispersion hint is usually
 *   close above A, so this finds a lower bound in one or two fleets where a geometric
 *   step from the minimum would take several;
 * - nothing was above A yet (b is the cap, unverified): A is at or just above a, the
 *   hint or a grey rate (a token bucket, a sender near its limit): step up by twice the
 *   resolution, then double, instead of bisecting up to the cap. */
static double step(const struct pbox_slops_search *s, double a, double b)
{
	double r = midpoint(a, b);

	if (s->hint && !s->lo_seen && b / 2 > r) {
		r = b / 2;
	}
	if (s->hint && !s->hi_seen && b == s->hi && (s->lo_seen || a > s->lo)) {
		double up = a * (s->up_steps ? 2 : 1 + 2 * s->resolution);

		r = up < r ? up : r;
	}
	return r;
}

bool pbox_slops_search_next(const struct pbox_slops_search *s, double *bps)
{
	double width = s->resolution * s->hi;

	if (s->fleets == 0 && s->next > 0) {
		*bps = s->next;
		return true;
	}
	if (!have_grey(s)) {
		if (s->hi - s->lo <= width) {
			return false;
		}
		*bps = step(s, s->lo, s->hi);
		return true;
	}
	/* pathload: narrow the gap below the grey region, then the one above it. */
	if (s->grey_lo - s->lo > width) {
		*bps = step(s, s->lo, s->grey_lo);
		return true;
	}
	if (s->hi - s->grey_hi > width) {
		*bps = step(s, s->grey_hi, s->hi);
		return true;
	}
	return false;
}

void pbox_slops_search_update(struct pbox_slops_search *s, double bps,
			      enum pbox_slops_verdict fleet)
{
	s->fleets++;
	if (bps < s->lo || bps > s->hi) {
		return; /* not a rate this search asked for: no information about [lo, hi] */
	}
	switch (fleet) {
	case PBOX_SLOPS_NOTREND:
		s->up_steps += s->hint && s->lo_seen && !s->hi_seen;
		s->lo = bps;
		s->lo_seen = true;
		if (s->grey_lo < bps) {
			s->grey_lo = bps;
		}
		break;
	case PBOX_SLOPS_INCREASING:
		s->hi = bps;
		s->hi_seen = true;
		s->flags &= ~PBOX_SLOPS_F_SENDER_LIMITED;
		if (s->grey_hi > bps) {
			s->grey_hi = bps;
		}
		break;
	case PBOX_SLOPS_GREY:
		s->grey_lo = bps < s->grey_lo ? bps : s->grey_lo;
		s->grey_hi = bps > s->grey_hi ? bps : s->grey_hi;
		break;
	default: /* the sender could not hold bps: search below it */
		s->hi = bps;
		s->flags |= PBOX_SLOPS_F_SENDER_LIMITED;
		if (s->grey_hi > bps) {
			s->grey_hi = bps;
		}
		break;
	}
	/* A NOTREND above, or an INCREASING below, every grey rate leaves no grey region. */
	if (s->grey_hi <= s->lo || s->grey_lo >= s->hi) {
		s->grey_lo = s->cap_bps * 2;
		s->grey_hi = 0;
	}
}

void pbox_slops_search_result(const struct pbox_slops_search *s, struct pbox_slops_range *out)
{
	double unused;

	out->r_min = s->lo;
	out->r_max = s->hi;
	out->grey_min = have_grey(s) ? s->grey_lo : 0;
	out->grey_max = have_grey(s) ? s->grey_hi : -1;
	out->fleets = s->fleets;
	out->flags = s->flags;
	if (!pbox_slops_search_next(s, &unused)) {
		out->flags |= PBOX_SLOPS_F_CONVERGED;
	}
	if (!s->hi_seen && !(s->flags & PBOX_SLOPS_F_SENDER_LIMITED)) {
		out->flags |= PBOX_SLOPS_F_AT_CAP;
	}
	if (!s->lo_seen) {
		out->flags |= PBOX_SLOPS_F_AT_MIN;
	}
}
