package main

import (
	"fmt"
	"math/rand/v2"
	"slices"
)

// The isolation scenario's statistics (issue 32): on a shared machine one phase can be slowed by
// a neighbour, so each peer's figures are paired per round (the flood phase over the idle phase
// of the same round, measured back to back) and reported as the median of those per-round ratios
// with a percentile bootstrap confidence interval. The resampling is seeded: the same rounds give
// the same interval on every run and every machine.

const (
	// bootstrapResamples is the number of resamples of the per-round ratios.
	bootstrapResamples = 2000
	// bootstrapLevel is the confidence level of the interval.
	bootstrapLevel = 0.95
	// bootstrapSeed seeds the resampling.
	bootstrapSeed = 32
)

// Estimate is a statistic of a few per-round values with its bootstrap confidence interval.
type Estimate struct {
	// Median is the median of the values.
	Median float64
	// Lo and Hi bound the interval (Lo <= Median <= Hi for any input).
	Lo, Hi float64
	// N is the number of values.
	N int
}

// String renders the estimate as "1.02 [0.97, 1.10]" with the given format for each number.
func (e Estimate) String() string { return e.Format("%.2f") }

// Format renders the estimate with f (such as "%.2f") for each of its three numbers.
func (e Estimate) Format(f string) string {
	if e.N == 0 {
		return "-"
	}
	return fmt.Sprintf(f+" ["+f+", "+f+"]", e.Median, e.Lo, e.Hi)
}

// medianCI is the median of xs and its percentile bootstrap interval at bootstrapLevel, from
// bootstrapResamples resamples drawn with bootstrapSeed.
func medianCI(xs []float64) Estimate {
	if len(xs) == 0 {
		return Estimate{}
	}
	meds := bootstrapMedians(xs, bootstrapResamples, bootstrapSeed)
	slices.Sort(meds)
	m := median(xs)
	tail := (1 - bootstrapLevel) / 2
	// The median of the data is inside any sensible interval; with very few rounds the
	// resamples' percentiles could otherwise miss it by the resolution of the order statistics.
	lo, hi := percentile(meds, tail), percentile(meds, 1-tail)
	return Estimate{Median: m, Lo: min(lo, m), Hi: max(hi, m), N: len(xs)}
}

// bootstrapMedians draws n resamples of xs with replacement (each of len(xs) values, from a
// PCG generator seeded with seed) and returns the median of each.
func bootstrapMedians(xs []float64, n int, seed uint64) []float64 {
	rng := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	out := make([]float64, n)
	sample := make([]float64, len(xs))
	for i := range out {
		for j := range sample {
			sample[j] = xs[rng.IntN(len(xs))]
		}
		out[i] = median(sample)
	}
	return out
}

// percentile is the q-quantile (0..1) of sorted values, interpolated linearly between the two
// nearest order statistics (Hyndman and Fan's type 7, the default of R and NumPy).
func percentile(sorted []float64, q float64) float64 {
	if len(sorted) == 0 {
		return 0
	}
	h := q * float64(len(sorted)-1)
	i := int(h)
	if i >= len(sorted)-1 {
		return sorted[len(sorted)-1]
	}
	return sorted[i] + (h-float64(i))*(sorted[i+1]-sorted[i])
}

// pairedRatios is b[i]/a[i] for each round whose a[i] is positive.
func pairedRatios(a, b []float64) []float64 {
	out := make([]float64, 0, len(a))
	for i := range min(len(a), len(b)) {
		if a[i] > 0 {
			out = append(out, b[i]/a[i])
		}
	}
	return out
}

// ratioOf is a/b, 0 when b is not positive.
func ratioOf(a, b float64) float64 {
	if b <= 0 {
		return 0
	}
	return a / b
}

// lossText renders a throughput ratio estimate as a change in percent, such as "-3.1% [-5.0, -1.2]".
func lossText(e Estimate) string {
	if e.N == 0 {
		return "-"
	}
	return fmt.Sprintf("%+.1f%% [%+.1f, %+.1f]", 100*(e.Median-1), 100*(e.Lo-1), 100*(e.Hi-1))
}
