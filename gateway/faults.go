package gateway

import "sync/atomic"

// Fault points: places of the request path where a test can make the gateway panic, to prove
// that each recover path answers 500 and releases every slot (SPEC 3 step 11). faultAt is nil
// outside tests, so fault costs one atomic load.
const (
	faultHeaderHook = "header hook" // in onHeaders, after admission took the slots
	faultHandler    = "handler"     // in handle, before the request is forwarded
)

var faultAt atomic.Pointer[string]

// fault panics when a test armed the fault point at.
func fault(at string) {
	if p := faultAt.Load(); p != nil && *p == at {
		panic("gateway: test fault: " + at)
	}
}
