package main

import (
	"math"
	"slices"
	"testing"
)

func TestMedianCIConstantInput(t *testing.T) {
	e := medianCI([]float64{1.25, 1.25, 1.25, 1.25, 1.25, 1.25, 1.25, 1.25, 1.25})
	if e.Median != 1.25 || e.Lo != 1.25 || e.Hi != 1.25 || e.N != 9 {
		t.Errorf("medianCI of nine 1.25 = %+v, want 1.25 [1.25, 1.25] of 9", e)
	}
}

func TestMedianCIEmpty(t *testing.T) {
	if e := medianCI(nil); e.N != 0 || e.String() != "-" {
		t.Errorf("medianCI(nil) = %+v (%s), want nothing", e, e)
	}
}

func TestMedianCIDeterministic(t *testing.T) {
	xs := []float64{1.02, 0.97, 1.31, 1.08, 2.3, 1.0, 1.12, 0.95, 1.05}
	a, b := medianCI(xs), medianCI(slices.Clone(xs))
	if a != b {
		t.Errorf("two runs on the same rounds differ: %+v and %+v", a, b)
	}
	if a.Median != 1.05 {
		t.Errorf("median = %v, want 1.05", a.Median)
	}
	if !(a.Lo <= a.Median && a.Median <= a.Hi) || a.Lo < 0.95 || a.Hi > 2.3 {
		t.Errorf("interval %s does not hold the median inside the data's range", a)
	}
	// One outlier round (2.3) must not drag the upper bound to it: that is why the median.
	if a.Hi >= 2.3 {
		t.Errorf("upper bound %v reached the outlier", a.Hi)
	}
	if c := bootstrapMedians(xs, 50, 7); !slices.Equal(c, bootstrapMedians(xs, 50, 7)) {
		t.Error("the same seed drew different resamples")
	} else if slices.Equal(c, bootstrapMedians(xs, 50, 8)) {
		t.Error("another seed drew the same resamples")
	}
}

// TestBootstrapMatchesExactDistribution checks the resampling against the exact bootstrap
// distribution of the median of 1..9: the median of a resample of 9 is at most k when at least
// 5 of its 9 draws are, so P(median <= k) = P(Bin(9, k/9) >= 5).
func TestBootstrapMatchesExactDistribution(t *testing.T) {
	xs := []float64{1, 2, 3, 4, 5, 6, 7, 8, 9}
	meds := bootstrapMedians(xs, bootstrapResamples, bootstrapSeed)
	for k := 1; k <= 9; k++ {
		exact := 0.0
		p := float64(k) / 9
		for j := 5; j <= 9; j++ {
			exact += binom(9, j) * math.Pow(p, float64(j)) * math.Pow(1-p, float64(9-j))
		}
		n := 0
		for _, m := range meds {
			if m <= float64(k) {
				n++
			}
		}
		got := float64(n) / float64(len(meds))
		// 2,000 draws: the standard error of a share is at most 0.011; 0.04 is beyond 3.5 of them.
		if math.Abs(got-exact) > 0.04 {
			t.Errorf("P(median <= %d) = %.3f over the resamples, exact %.3f", k, got, exact)
		}
	}
	// The exact 2.5% and 97.5% points are 3 and 7 (P(median <= 2) = 0.020, P(median <= 3) =
	// 0.145, P(median <= 6) = 0.855, P(median <= 7) = 0.980): the interval is within [2, 8].
	e := medianCI(xs)
	if e.Median != 5 || e.Lo < 2 || e.Lo > 3 || e.Hi < 7 || e.Hi > 8 {
		t.Errorf("medianCI(1..9) = %s, want 5 [2..3, 7..8]", e)
	}
}

func binom(n, k int) float64 {
	r := 1.0
	for i := 1; i <= k; i++ {
		r = r * float64(n-k+i) / float64(i)
	}
	return r
}

func TestPercentile(t *testing.T) {
	s := []float64{10, 20, 30, 40, 50}
	for _, c := range []struct{ q, want float64 }{{0, 10}, {0.25, 20}, {0.5, 30}, {0.6, 34}, {1, 50}} {
		if got := percentile(s, c.q); math.Abs(got-c.want) > 1e-9 {
			t.Errorf("percentile(%v) = %v, want %v", c.q, got, c.want)
		}
	}
	if percentile(nil, 0.5) != 0 {
		t.Error("percentile of nothing is not 0")
	}
}

func TestPairedRatios(t *testing.T) {
	got := pairedRatios([]float64{2, 0, 4}, []float64{3, 5, 2})
	if !slices.Equal(got, []float64{1.5, 0.5}) {
		t.Errorf("pairedRatios = %v, want [1.5 0.5] (the round with a 0 left out)", got)
	}
}

func TestEstimateFormat(t *testing.T) {
	e := Estimate{Median: 1.024, Lo: 0.97, Hi: 1.1, N: 9}
	if got := e.String(); got != "1.02 [0.97, 1.10]" {
		t.Errorf("String() = %q", got)
	}
	if got := e.Format("%.1f"); got != "1.0 [1.0, 1.1]" {
		t.Errorf("Format(%%.1f) = %q", got)
	}
}
