// Package dnstest is a real DNS server on loopback for tests (DNS discovery, SPEC 13): it
// answers A and AAAA queries from records the test changes. Only tests import it.
package dnstest

import (
	"net"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/miekg/dns"
)

// Server is a real DNS server on loopback (UDP) answering A and AAAA queries from records
// the test changes: a known name with no addresses answers NOERROR without records, an unknown
// name NXDOMAIN, and with servfail set every query SERVFAIL.
type Server struct {
	// Addr is the server's "127.0.0.1:port" (UDP), what server.resolver names.
	Addr    string
	srv     *dns.Server
	mu      sync.Mutex
	records map[string][]netip.Addr // fully qualified, lower case
	// ServFail, when set, answers every query SERVFAIL.
	ServFail atomic.Bool
	// Queries counts the queries answered.
	Queries  atomic.Int64
	stopOnce sync.Once
}

// New starts a server; t's cleanup stops it.
func New(t testing.TB) *Server {
	t.Helper()
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	d := &Server{Addr: pc.LocalAddr().String(), records: map[string][]netip.Addr{}}
	started := make(chan struct{})
	d.srv = &dns.Server{PacketConn: pc, Handler: dns.HandlerFunc(d.serve), NotifyStartedFunc: func() { close(started) }}
	go func() { _ = d.srv.ActivateAndServe() }()
	<-started
	t.Cleanup(d.Stop)
	return d
}

// Set gives name (without the final dot) these addresses; none means NOERROR without
// records.
func (d *Server) Set(name string, addrs ...string) {
	list := make([]netip.Addr, 0, len(addrs))
	for _, a := range addrs {
		list = append(list, netip.MustParseAddr(a))
	}
	d.mu.Lock()
	d.records[dns.Fqdn(strings.ToLower(name))] = list
	d.mu.Unlock()
}

// Remove makes name unknown: NXDOMAIN.
func (d *Server) Remove(name string) {
	d.mu.Lock()
	delete(d.records, dns.Fqdn(strings.ToLower(name)))
	d.mu.Unlock()
}

// Stop shuts the server down: queries are then refused by the kernel (a failed lookup).
func (d *Server) Stop() {
	d.stopOnce.Do(func() { _ = d.srv.Shutdown() })
}

// serve answers one query.
func (d *Server) serve(w dns.ResponseWriter, q *dns.Msg) {
	d.Queries.Add(1)
	m := new(dns.Msg)
	m.SetReply(q)
	m.Authoritative = true
	m.RecursionAvailable = true
	if d.ServFail.Load() {
		m.Rcode = dns.RcodeServerFailure
		_ = w.WriteMsg(m)
		return
	}
	d.mu.Lock()
	for _, question := range q.Question {
		addrs, known := d.records[strings.ToLower(question.Name)]
		if !known {
			m.Rcode = dns.RcodeNameError
			continue
		}
		hdr := dns.RR_Header{Name: question.Name, Class: dns.ClassINET, Ttl: 1}
		for _, a := range addrs {
			switch {
			case question.Qtype == dns.TypeA && a.Is4():
				hdr.Rrtype = dns.TypeA
				m.Answer = append(m.Answer, &dns.A{Hdr: hdr, A: net.IP(a.AsSlice())})
			case question.Qtype == dns.TypeAAAA && a.Is6():
				hdr.Rrtype = dns.TypeAAAA
				m.Answer = append(m.Answer, &dns.AAAA{Hdr: hdr, AAAA: net.IP(a.AsSlice())})
			}
		}
	}
	d.mu.Unlock()
	_ = w.WriteMsg(m)
}
