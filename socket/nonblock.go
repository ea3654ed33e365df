// Package socket holds the socket calls both sides of the proxy share (STYLE 1): the
// non-blocking raw reads, writes and peeks (nonblock.go), the write-then-wait raw path of a
// plain TCP connection (raw.go), the liveness peek (peek.go), and the socket below a TLS layer
// with its sliding write window (window.go). The gateway (client connections) and package
// upstream (upstream connections) both import it; it imports only the standard library.
//
// This file owns the raw system calls and Conn, the non-blocking socket below TLS.
package socket

import (
	"errors"
	"io"
	"net"
	"os"
	"sync"
	"syscall"
	"unsafe"
)

// The system calls of the raw path (raw.go) and the liveness peek (peek.go) are made
// with RawSyscall, without the runtime's entersyscall and exitsyscall around them.
//
// Why: each of them is a read, write or MSG_DONTWAIT recvfrom on a socket that is in
// non-blocking mode (the net package sets O_NONBLOCK on every socket it opens or accepts), so
// none can block: it copies what the socket buffer holds, or fails with EAGAIN. The hand-off
// that entersyscall prepares, so that another thread can run goroutines while this one waits in
// the kernel, has nothing to wait for here. It still costs: on loopback a write delivers the
// segment to the receiver inside the call (tens of microseconds under load), long enough for
// sysmon to find the P "in a system call", retake it and wake another thread for it, which on a
// busy core only takes turns with the first (profile of the peer comparison: retake's handoffp
// and entersyscall's sysmon wake-up were 23% of the futex calls, sysmon's own 20 µs sleeps 3.5%
// of the samples). nginx, an event loop, has no such hand-off at all.
//
// The cost of the choice: while one of these calls runs, its P runs nothing else and a
// stop-the-world waits for it to return, which is microseconds for a non-blocking call.
// The buffer's address is converted in the call expression itself, as unsafe.Pointer's rule
// for system calls requires, so that the buffer stays alive and in place during the call.
// Anything that may block (a connect, a close with linger, a file) keeps the ordinary calls.
// Under the race detector the calls report their buffers and an order from writes to reads,
// as syscall.Read and syscall.Write do (nonblock_race.go).

// nbRead is read(2) on a non-blocking socket.
func nbRead(fd uintptr, p []byte) (int, error) {
	n, _, e := syscall.RawSyscall(syscall.SYS_READ, fd, uintptr(unsafe.Pointer(unsafe.SliceData(p))), uintptr(len(p)))
	if e != 0 {
		return 0, e
	}
	raceRead(p, int(n))
	return int(n), nil
}

// nbWrite is write(2) on a non-blocking socket.
func nbWrite(fd uintptr, p []byte) (int, error) {
	raceWrite(p)
	n, _, e := syscall.RawSyscall(syscall.SYS_WRITE, fd, uintptr(unsafe.Pointer(unsafe.SliceData(p))), uintptr(len(p)))
	if e != 0 {
		return 0, e
	}
	return int(n), nil
}

// nbPeek is recvfrom(2) with MSG_PEEK|MSG_DONTWAIT: the bytes waiting, without consuming them.
func nbPeek(fd uintptr, p []byte) (int, error) {
	n, _, e := syscall.RawSyscall6(syscall.SYS_RECVFROM, fd, uintptr(unsafe.Pointer(unsafe.SliceData(p))), uintptr(len(p)),
		syscall.MSG_PEEK|syscall.MSG_DONTWAIT, 0, 0)
	if e != 0 {
		return 0, e
	}
	raceRead(p, int(n))
	return int(n), nil
}

// Conn is a plain TCP socket whose Read and Write make the raw calls above: the socket below
// a TLS layer (Windowed, at the client's accept and the upstream's dial), which the raw
// path cannot serve because TLS reads whole records through its own buffer. Its semantics are
// net.Conn's: Read tries the socket first and then waits under the read deadline, Write writes
// everything, waiting under the write deadline when the socket's buffer is full, and their
// errors are the *net.OpError that net.TCPConn returns. One Read and one Write at a time own
// their half of the state (rmu, wmu), as the poller serializes them anyway.
type Conn struct {
	*net.TCPConn
	rc syscall.RawConn

	rmu  sync.Mutex
	rfn  func(fd uintptr) bool // readFD, bound once (no allocation per call)
	rp   []byte
	rn   int
	rerr error

	wmu  sync.Mutex
	wfn  func(fd uintptr) bool // writeFD
	wp   []byte
	wn   int
	werr error
}

// NonBlocking returns c as a Conn when it is a *net.TCPConn, else c itself.
func NonBlocking(c net.Conn) net.Conn {
	tc, rc, ok := Of(c)
	if !ok {
		return c
	}
	s := &Conn{TCPConn: tc, rc: rc}
	s.rfn, s.wfn = s.readFD, s.writeFD
	return s
}

// Of returns c's RawConn when c is the kernel's socket itself: a wrapper (the PROXY
// protocol's, TLS) may hold bytes read from it that the socket no longer has.
func Of(c net.Conn) (*net.TCPConn, syscall.RawConn, bool) {
	tc, ok := c.(*net.TCPConn)
	if !ok {
		return nil, nil, false
	}
	rc, err := tc.SyscallConn()
	if err != nil {
		return nil, nil, false
	}
	return tc, rc, true
}

// ReadStep reads once into p: again when the socket has nothing yet (EAGAIN; EINTR is
// retried), else the bytes read, io.EOF at the end of the stream, or the call's error.
func ReadStep(fd uintptr, p []byte) (n int, again bool, err error) {
	for {
		n, err := nbRead(fd, p)
		if err == syscall.EINTR {
			continue
		}
		if err == nil && n == 0 && len(p) > 0 {
			return 0, false, io.EOF
		}
		return stepOutcome(n, err, "read")
	}
}

// WriteStep writes p once (EINTR is retried): the bytes the socket took, again when it took
// none because its buffer is full (EAGAIN), or the call's error.
func WriteStep(fd uintptr, p []byte) (n int, again bool, err error) {
	for {
		n, err := nbWrite(fd, p)
		if err == syscall.EINTR {
			continue
		}
		return stepOutcome(n, err, "write")
	}
}

// stepOutcome is what ReadStep and WriteStep return for a raw call that was not interrupted:
// again on EAGAIN, the call's error named after op, else the bytes it moved.
func stepOutcome(n int, err error, op string) (int, bool, error) {
	switch {
	case err == syscall.EAGAIN:
		return 0, true, nil
	case err != nil:
		return 0, false, os.NewSyscallError(op, err)
	}
	return n, false, nil
}

// Read reads into p as net.TCPConn.Read does, through the raw calls.
func (s *Conn) Read(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	s.rmu.Lock()
	defer s.rmu.Unlock()
	s.rp, s.rn, s.rerr = p, 0, nil
	err := s.rc.Read(s.rfn)
	s.rp = nil
	if err != nil {
		return 0, s.opError("read", err)
	}
	return s.rn, s.rerr
}

func (s *Conn) readFD(fd uintptr) bool {
	n, again, err := ReadStep(fd, s.rp)
	switch {
	case again:
		return false // wait for the socket
	case err == io.EOF:
		s.rerr = err
	case err != nil:
		s.rerr = s.opError("read", err)
	}
	s.rn = n
	return true
}

// Write writes all of p as net.TCPConn.Write does, through the raw calls.
func (s *Conn) Write(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	s.wmu.Lock()
	defer s.wmu.Unlock()
	s.wp, s.wn, s.werr = p, 0, nil
	err := s.rc.Write(s.wfn)
	s.wp = nil
	if err != nil && s.werr == nil {
		s.werr = s.opError("write", err)
	}
	return s.wn, s.werr
}

func (s *Conn) writeFD(fd uintptr) bool {
	for len(s.wp) > 0 {
		n, again, err := WriteStep(fd, s.wp)
		s.wn += n
		s.wp = s.wp[n:]
		switch {
		case again:
			return false // wait until the socket takes more
		case err != nil:
			s.werr = s.opError("write", err)
			return true
		}
	}
	return true
}

// opError wraps err as net.TCPConn's Read and Write do; the poller's own errors (a deadline,
// a closed connection) come from RawConn wrapped once already, as "raw-read" or "raw-write".
func (s *Conn) opError(op string, err error) error {
	var oe *net.OpError
	if errors.As(err, &oe) {
		err = oe.Err
	}
	return &net.OpError{Op: op, Net: "tcp", Source: s.LocalAddr(), Addr: s.RemoteAddr(), Err: err}
}
