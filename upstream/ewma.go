package upstream

import (
	"math"
	"sync"
	"time"
)

// Peak EWMA (SPEC 13 p2c), the latency half of the balancer: each target keeps an estimate
// of its latency that jumps up at once to a slower sample (the peak) and decays towards
// faster ones, and towards zero while the target is idle, with the time constant
// latency_decay. p2c compares est·(inflight+1)/weight of two targets drawn at random.
//
// # Who calls what
//
// The exchange calls Target.Observe once per attempt, when the attempt's latency is known
// and before the attempt's Done:
//
//   - a response head arrived: Observe(d, OutcomeOf(status)), d the time from the last byte of
//     the request head and body written to the upstream socket to the end of the response head
//     (a long upload is not latency: it is excluded, since the clock starts at its last byte);
//     a 502, 503 or 504 head is a Failure, so it counts as at least FailureSample;
//   - no head, the target failed (refused or timed-out dial, reset or close before the head,
//     the header timeout): Observe(d, Failure) with d the time waited since the last byte
//     written, 0 if nothing was written; it counts as at least FailureSample;
//   - no head, nobody failed (the client left, its body failed): no call, or Observe(d,
//     Neutral), which records nothing.
//
// A WebSocket tunnel gives no sample: its Upgrade answer says nothing of the latency of a
// request, so tunnel code never calls Observe. The health checks give none either.

// Defaults and bounds of the peak-EWMA and discovery settings (conf enforces the bounds).
const (
	// DefaultLatencyDecay is latency_decay's default: a slow target's estimate has lost 63%
	// of its excess after 10 s, so it is tried again within seconds once it is idle.
	DefaultLatencyDecay = 10 * time.Second
	// FailureSample is the least sample of a failed attempt: a target that fails fast (a
	// refused dial, an instant 503) must look slow to p2c, not fast.
	FailureSample = time.Second
	// noSampleCost is the cost of a target with no sample yet and a request in flight (plus
	// the in-flight count): above any real estimate, so it gets its one probe request and
	// then waits for that answer.
	noSampleCost = 1e9
)

// peakEWMA is one target's latency estimate. mu guards it: a pick and a sample each hold it
// for a few arithmetic operations (and at most one math.Exp), so it is never held long.
type peakEWMA struct {
	mu sync.Mutex
	// est is the estimate in seconds, meaningful once sampled.
	est float64
	// stamp is the Set.now time of the last observe.
	stamp   int64
	sampled bool
}

// observeLocked is SPEC 13's observe(x, now): w = exp(-(now-stamp)/decay); est = x when x is
// above est, else est·w + x·(1-w); stamp = now. decay is in nanoseconds. A now before stamp
// (two goroutines read the clock and then the lock in the other order) counts as no time.
func (e *peakEWMA) observeLocked(x float64, now int64, decay float64) {
	switch {
	case !e.sampled:
		e.est, e.stamp, e.sampled = x, now, true
		return
	case x > e.est:
		e.est = x
	case now > e.stamp:
		w := math.Exp(-float64(now-e.stamp) / decay)
		e.est = e.est*w + x*(1-w)
	}
	e.stamp = max(e.stamp, now)
}

// Observe records one attempt's latency sample on the target (see "Who calls what" above):
// d for a Success, max(d, FailureSample) for a Failure, nothing for Neutral. Call it at most
// once per attempt, before that attempt's Done. It does not allocate.
func (t *Target) Observe(d time.Duration, o Outcome) {
	switch o {
	case Neutral:
		return
	case Failure:
		d = max(d, FailureSample)
	}
	now := t.set.now()
	e := &t.st.ewma
	e.mu.Lock()
	e.observeLocked(d.Seconds(), now, t.set.decay)
	e.mu.Unlock()
}

// cost is SPEC 13's cost(now): observe(0, now) first (an idle target's estimate decays), then
// est·(inflight+1)/weight; a target with no sample yet costs 0 with nothing in flight and
// noSampleCost+inflight with something in flight.
func (t *Target) cost(now int64) float64 {
	st := t.st
	in := st.inflight.Load()
	e := &st.ewma
	e.mu.Lock()
	if !e.sampled {
		e.mu.Unlock()
		if in <= 0 {
			return 0
		}
		return noSampleCost + float64(in)
	}
	e.observeLocked(0, now, t.set.decay)
	est := e.est
	e.mu.Unlock()
	return est * float64(in+1) / float64(t.weight)
}

// Latency returns the target's current latency estimate (decayed to now, as a pick sees it)
// and whether it has any sample yet. For tests, logs and -check; it updates the stamp like a
// pick does.
func (t *Target) Latency() (time.Duration, bool) {
	e := &t.st.ewma
	now := t.set.now()
	e.mu.Lock()
	defer e.mu.Unlock()
	if !e.sampled {
		return 0, false
	}
	e.observeLocked(0, now, t.set.decay)
	return time.Duration(e.est * float64(time.Second)), true
}
