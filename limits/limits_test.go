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

// TestWorkerPoolStress: under many goroutines that acquire with short waits and release, the
// pool never holds more than its size, no waiter is lost (every one either gets a slot or times
// out), and the count returns to zero.
func TestWorkerPoolStress(t *testing.T) {
	const size = 4
	p := NewWorkerPool(size)
	var held, peak atomic.Int64
	var wg sync.WaitGroup
	var got, refused atomic.Int64
	for g := 0; g < 32; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 200; i++ {
				if !p.Acquire(time.Millisecond) {
					refused.Add(1)
					continue
				}
				got.Add(1)
				n := held.Add(1)
				for {
					m := peak.Load()
					if n <= m || peak.CompareAndSwap(m, n) {
						break
					}
				}
				if i%7 == 0 {
					time.Sleep(50 * time.Microsecond)
				}
				held.Add(-1)
				p.Release()
			}
		}()
	}
	wg.Wait()
	if peak.Load() > size {
		t.Errorf("peak %d workers held, size %d", peak.Load(), size)
	}
	if p.Busy() != 0 || p.nwait.Load() != 0 || len(p.waiters) != 0 {
		t.Errorf("after the run: busy %d, waiters %d/%d, want 0", p.Busy(), p.nwait.Load(), len(p.waiters))
	}
	if got.Load()+refused.Load() != 32*200 || got.Load() == 0 {
		t.Errorf("got %d, refused %d of %d", got.Load(), refused.Load(), 32*200)
	}
}

// TestWorkerPoolHandsOverInOrder: a released slot goes to the oldest waiter, not to whoever
// asks next without waiting.
func TestWorkerPoolHandsOverInOrder(t *testing.T) {
	p := NewWorkerPool(1)
	if !p.Acquire(0) {
		t.Fatal("first acquire")
	}
	done := make(chan bool, 1)
	go func() { done <- p.Acquire(5 * time.Second) }()
	for p.nwait.Load() == 0 {
		time.Sleep(time.Millisecond)
	}
	p.Release()
	if p.Acquire(0) {
		t.Fatal("a newcomer took the slot promised to the waiter")
	}
	if !<-done {
		t.Fatal("the waiter got no slot")
	}
	p.Release()
	if p.Busy() != 0 {
		t.Fatalf("busy %d after the releases", p.Busy())
	}
}
