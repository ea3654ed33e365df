package limits

import (
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

func TestBulkheadNeverOvershoots(t *testing.T) {
	b := NewBulkhead(8)
	var inside, maxSeen atomic.Int64
	var wg sync.WaitGroup
	for i := 0; i < 64; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := 0; j < 2000; j++ {
				if !b.TryAcquire() {
					continue
				}
				n := inside.Add(1)
				for {
					m := maxSeen.Load()
					if n <= m || maxSeen.CompareAndSwap(m, n) {
						break
					}
				}
				inside.Add(-1)
				b.Release()
			}
		}()
	}
	wg.Wait()
	if maxSeen.Load() > 8 {
		t.Fatalf("%d holders at once, ceiling 8", maxSeen.Load())
	}
	if b.InFlight() != 0 {
		t.Fatalf("in flight %d after all releases", b.InFlight())
	}
}

func TestBulkheadUnlimitedCounts(t *testing.T) {
	b := NewBulkhead(0)
	for i := 0; i < 100; i++ {
		if !b.TryAcquire() {
			t.Fatal("unlimited bulkhead refused")
		}
	}
	if b.InFlight() != 100 {
		t.Fatalf("in flight %d", b.InFlight())
	}
	b.SetMax(10)
	if b.TryAcquire() {
		t.Fatal("shrunk bulkhead admitted above its new ceiling")
	}
}

func TestBulkheadDoubleReleasePanics(t *testing.T) {
	defer func() {
		if recover() == nil {
			t.Fatal("no panic on a release without acquire")
		}
	}()
	NewBulkhead(1).Release()
}

func TestWorkerPoolWaitsThenRefuses(t *testing.T) {
	p := NewWorkerPool(2)
	if !p.Acquire(0) || !p.Acquire(0) {
		t.Fatal("free workers refused")
	}
	if p.Acquire(0) {
		t.Fatal("third worker granted without waiting")
	}
	start := time.Now()
	if p.Acquire(50 * time.Millisecond) {
		t.Fatal("worker granted from a full pool")
	}
	if d := time.Since(start); d < 40*time.Millisecond {
		t.Errorf("refused after %v, want the queue timeout", d)
	}
	go func() {
		time.Sleep(20 * time.Millisecond)
		p.Release()
	}()
	if !p.Acquire(5 * time.Second) {
		t.Fatal("a freed worker was not handed to the waiter")
	}
	if p.Busy() != 2 || p.Size() != 2 {
		t.Fatalf("busy %d size %d", p.Busy(), p.Size())
	}
}

func TestWorkerPoolAcquireAllocs(t *testing.T) {
	p := NewWorkerPool(4)
	if n := testing.AllocsPerRun(1000, func() {
		p.Acquire(time.Millisecond)
		p.Release()
	}); n != 0 {
		t.Errorf("%v allocations per acquire/release", n)
	}
}
