// Package limits decides how much and how many at run time: the route bulkheads, the elevated
// budget shared by all elevated routes, the request-level worker pool and the body ceilings
// (SPEC 3 steps 5-6 and 8, SPEC 4). It imports only the standard library: the gateway turns
// configuration into these small types and maps their errors to statuses.
package limits

import "errors"

// Sentinel errors of admission and body ceilings; the gateway maps each to its status and
// reject reason with errors.Is.
var (
	// ErrBodyTooLarge reports a body (declared or counted) above the route's ceiling.
	ErrBodyTooLarge = errors.New("limits: body exceeds route limit")
	// ErrConcurrency reports a route whose bulkhead is full.
	ErrConcurrency = errors.New("limits: route concurrency limit reached")
	// ErrElevatedBudget reports that the elevated routes together hold their whole budget.
	ErrElevatedBudget = errors.New("limits: elevated budget exhausted")
	// ErrWorkersSaturated reports that no worker freed up within the queue timeout.
	ErrWorkersSaturated = errors.New("limits: worker pool saturated")
)
