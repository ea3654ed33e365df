package upstream

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"sync"
	"time"
)

// DNS discovery (SPEC 13): a targets entry with discover: dns is a name standing for one
// target per address. Each such entry has one goroutine, owned by its Set: started by NewSet,
// stopped (and waited for) by Close or by the NewSet that takes the Set over.

// Defaults of DNS discovery.
const (
	// DefaultDiscoveryRefresh is discovery_refresh's default: a new pod is served, and a
	// removed one left, within 5 s, for one small query per name and replica.
	DefaultDiscoveryRefresh = 5 * time.Second
	// startLookupTimeout bounds the lookups NewSet waits for: a resolver that does not answer
	// delays a start or a reload by this much at most, and the route then answers 503 until
	// the discovery goroutine gets an answer.
	startLookupTimeout = 3 * time.Second
	// maxLookupTimeout bounds one refresh's lookup.
	maxLookupTimeout = 5 * time.Second
)

// LookupFunc resolves a host name to its addresses. An answer without any address is either
// an empty list with a nil error, or an error for which IsEmptyAnswer reports true (NXDOMAIN,
// NOERROR without records); any other error is a failed lookup (timeout, SERVFAIL, refusal).
type LookupFunc func(ctx context.Context, host string) ([]netip.Addr, error)

// NewDNSLookup returns the LookupFunc of server.resolver: queries go to server ("host:port"
// of a DNS server, over UDP and over TCP for truncated answers) through Go's own resolver;
// server "" is the system's resolver. It asks for A and AAAA records.
func NewDNSLookup(server string) LookupFunc {
	r := net.DefaultResolver
	if server != "" {
		var d net.Dialer
		r = &net.Resolver{
			PreferGo: true,
			Dial: func(ctx context.Context, network, _ string) (net.Conn, error) {
				return d.DialContext(ctx, network, server)
			},
		}
	}
	return func(ctx context.Context, host string) ([]netip.Addr, error) {
		return r.LookupNetIP(ctx, "ip", host)
	}
}

// IsEmptyAnswer reports whether a lookup's error is an answer without addresses (NXDOMAIN, or
// NOERROR without records) rather than a failed lookup.
func IsEmptyAnswer(err error) bool {
	var de *net.DNSError
	return errors.As(err, &de) && de.IsNotFound
}

// discoverer keeps one discovered entry's addresses up to date.
type discoverer struct {
	set     *Set
	name    string // the entry's host:port
	host    string
	port    uint16
	lookup  LookupFunc
	refresh time.Duration

	// addrs is the applied answer (sorted, unique), emptyOnce whether the last answer was
	// empty and not applied yet (SPEC 13: an empty answer applies when two in a row give it).
	// Guarded by set.viewMu once the goroutine runs.
	addrs     []netip.Addr
	emptyOnce bool
	// again asks for a lookup as soon as the goroutine starts (a reload took addrs over).
	again bool

	ctx     context.Context
	cancel  context.CancelFunc
	done    chan struct{}
	started bool
}

// newDiscoverer prepares the discoverer of entry name (host:port, validated).
func newDiscoverer(s *Set, name string, lookup LookupFunc, refresh time.Duration) *discoverer {
	host, portText, _ := net.SplitHostPort(name)
	port, _ := strconv.ParseUint(portText, 10, 16)
	d := &discoverer{set: s, name: name, host: host, port: uint16(port), lookup: lookup, refresh: refresh, done: make(chan struct{})}
	d.ctx, d.cancel = context.WithCancel(context.Background())
	return d
}

// initialLookups resolves the given entries at once, waiting at most startLookupTimeout, and
// applies their answers (nothing applies but addresses: there is no set to keep yet).
func (s *Set) initialLookups(es []*entry) {
	if len(es) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), startLookupTimeout)
	defer cancel()
	var wg sync.WaitGroup
	for _, e := range es {
		wg.Go(func() {
			addrs, err := e.disc.lookup(ctx, e.disc.host)
			e.disc.answer(addrs, err)
		})
	}
	wg.Wait()
}

// answer takes one lookup's result and reports whether the addresses changed: a failed lookup
// keeps them (and is counted), a first empty answer keeps them, a second one in a row empties
// them, any other answer replaces them.
func (d *discoverer) answer(addrs []netip.Addr, err error) bool {
	if err != nil && !IsEmptyAnswer(err) {
		d.set.discoveryErrors.Inc()
		return false
	}
	if err != nil || len(addrs) == 0 {
		if !d.emptyOnce {
			d.emptyOnce = true
			return false
		}
		if len(d.addrs) == 0 {
			return false
		}
		d.addrs = nil
		return true
	}
	d.emptyOnce = false
	next := make([]netip.Addr, 0, len(addrs))
	for _, a := range addrs {
		next = append(next, a.Unmap().WithZone(""))
	}
	slices.SortFunc(next, func(a, b netip.Addr) int { return a.Compare(b) })
	next = slices.Compact(next)
	if slices.Equal(next, d.addrs) {
		return false
	}
	d.addrs = next
	return true
}

// start runs the discoverer's goroutine.
func (d *discoverer) start() {
	d.started = true
	go d.run()
}

// run looks the name up every refresh until the discoverer is stopped, and rebuilds the Set's
// view when the addresses changed.
func (d *discoverer) run() {
	defer close(d.done)
	first := d.refresh
	if d.again {
		first = 0
	}
	timer := time.NewTimer(first)
	defer timer.Stop()
	for {
		select {
		case <-d.ctx.Done():
			return
		case <-timer.C:
		}
		if !d.refreshOnce() {
			return // stopped during the lookup: its answer belongs to nobody
		}
		timer.Reset(d.refresh)
	}
}

// refreshOnce looks the name up once and applies the answer, rebuilding the Set's view when
// the addresses changed. It reports false when the discoverer was stopped meanwhile.
func (d *discoverer) refreshOnce() bool {
	ctx, cancel := context.WithTimeout(d.ctx, min(max(d.refresh, time.Second), maxLookupTimeout))
	addrs, err := d.lookup(ctx, d.host)
	cancel()
	if d.ctx.Err() != nil {
		return false
	}
	s := d.set
	s.viewMu.Lock()
	if d.answer(addrs, err) {
		s.rebuildLocked(nil, true)
	}
	s.viewMu.Unlock()
	return true
}

// stop ends the goroutine and waits for it.
func (d *discoverer) stop() {
	d.cancel()
	if d.started {
		<-d.done
	}
}

// stopDiscovery stops every discovery goroutine of the Set and waits for them.
func (s *Set) stopDiscovery() {
	for _, e := range s.entries {
		if e.disc != nil {
			e.disc.stop()
		}
	}
}

// Discovered returns, for a discovered entry (host:port as configured), the addresses its
// last applied answer gave, sorted; nil for an entry without any or one not discovered.
func (s *Set) Discovered(entry string) []netip.Addr {
	s.viewMu.Lock()
	defer s.viewMu.Unlock()
	for _, e := range s.entries {
		if e.disc != nil && e.addr == entry {
			return slices.Clone(e.disc.addrs)
		}
	}
	return nil
}

// LookupEntry resolves a discovered entry's name once, as -check does: the addresses ip:port
// found, sorted. An empty answer is no error (nil, nil).
func LookupEntry(ctx context.Context, lookup LookupFunc, entry string) ([]string, error) {
	host, portText, err := net.SplitHostPort(entry)
	if err != nil {
		return nil, err
	}
	port, err := strconv.ParseUint(portText, 10, 16)
	if err != nil {
		return nil, err
	}
	if lookup == nil {
		lookup = NewDNSLookup("")
	}
	addrs, err := lookup(ctx, host)
	if err != nil {
		if IsEmptyAnswer(err) {
			return nil, nil
		}
		return nil, err
	}
	out := make([]string, 0, len(addrs))
	for _, a := range addrs {
		out = append(out, netip.AddrPortFrom(a.Unmap(), uint16(port)).String())
	}
	slices.Sort(out)
	return slices.Compact(out), nil
}
