package gateway

import (
	"syscall"
	"unsafe"
)

// The system calls of the raw path (upstreamraw.go) and the liveness peek (watch.go) are made
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

// nbRead is read(2) on a non-blocking socket.
func nbRead(fd uintptr, p []byte) (int, error) {
	n, _, e := syscall.RawSyscall(syscall.SYS_READ, fd, uintptr(unsafe.Pointer(unsafe.SliceData(p))), uintptr(len(p)))
	if e != 0 {
		return 0, e
	}
	return int(n), nil
}

// nbWrite is write(2) on a non-blocking socket.
func nbWrite(fd uintptr, p []byte) (int, error) {
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
	return int(n), nil
}
