package main

import (
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// The servers a run starts as processes of their own: the gateway (toron.go), the isolation
// scenario's references (peers.go) and this program as a helper (helpers.go). Each one's output
// goes to a log, it is waited for until /health answers, stopped by its own signal (killed after
// stopWait), and stopped too when the load test is interrupted.

const (
	// healthWait bounds how long a started gateway (or nginx) may take to answer /health.
	healthWait = 15 * time.Second
	// stopWait bounds the graceful stop after the stop signal (the generated config drains for
	// 0 s and gives in-flight requests 5 s); after it the process is killed.
	stopWait = 15 * time.Second
)

// process is a started server: the gateway, or nginx for reference (peers.go). It is stopped
// when the load test is interrupted (SIGINT, SIGTERM) and, as a last resort, when the load
// test dies (the child's parent-death signal).
type process struct {
	name    string
	cmd     *exec.Cmd
	port    int
	logPath string
	stopSig syscall.Signal
	exited  chan struct{}
	waitErr error
	// afterExit, when set, runs once after the process has exited and Stop saw it.
	afterExit func()
	afterOnce sync.Once

	// tlsClient, when set, is how the server is reached: it speaks HTTPS (tls.go).
	tlsClient *http.Client
}

// startProcess starts cmd with its output in logPath, then waits until
// http://127.0.0.1:port/health answers 200; stopSig is its graceful stop signal.
func startProcess(name string, cmd *exec.Cmd, port int, logPath string, stopSig syscall.Signal) (*process, error) {
	return startProcessTLS(name, cmd, port, logPath, stopSig, nil)
}

// startProcessTLS is startProcess for a server that speaks HTTPS, reached with tlsClient (nil:
// plain HTTP).
func startProcessTLS(name string, cmd *exec.Cmd, port int, logPath string, stopSig syscall.Signal, tlsClient *http.Client) (*process, error) {
	logFile, err := os.Create(logPath)
	if err != nil {
		return nil, fmt.Errorf("loadtest: cannot create the log of %s: %w", name, err)
	}
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGTERM}
	if err := cmd.Start(); err != nil {
		logFile.Close()
		return nil, fmt.Errorf("loadtest: cannot start %s: %w", cmd.Path, err)
	}
	p := &process{name: name, cmd: cmd, port: port, logPath: logPath, stopSig: stopSig, exited: make(chan struct{}), tlsClient: tlsClient}
	go func() {
		p.waitErr = cmd.Wait()
		logFile.Close()
		close(p.exited)
	}()
	track(p)
	if err := p.waitHealthy(); err != nil {
		p.Stop()
		return nil, err
	}
	return p, nil
}

// URL is the server's base URL.
func (p *process) URL() string {
	if p.tlsClient != nil {
		return "https://" + p.Addr()
	}
	return "http://" + p.Addr()
}

// Addr is the server's host:port, as a routes file's target or a raw client dials it.
func (p *process) Addr() string { return "127.0.0.1:" + strconv.Itoa(p.port) }

// PID is the server's process id.
func (p *process) PID() int { return p.cmd.Process.Pid }

func (p *process) waitHealthy() error {
	client := &http.Client{Timeout: time.Second}
	if p.tlsClient != nil {
		client = p.tlsClient
	}
	deadline := time.Now().Add(healthWait)
	for time.Now().Before(deadline) {
		select {
		case <-p.exited:
			return fmt.Errorf("loadtest: %s exited at start (%v); its log %s ends with:\n%s",
				p.name, p.waitErr, p.logPath, tail(p.logPath, 10))
		default:
		}
		resp, err := client.Get(p.URL() + "/health")
		if err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	return fmt.Errorf("loadtest: %s did not answer /health within %s; see %s", p.name, healthWait, p.logPath)
}

// PeakRSSBytes is the process's VmHWM, 0 when unknown.
func (p *process) PeakRSSBytes() int64 { return procStatusBytes(p.PID(), "VmHWM:") }

// Stop sends the stop signal and waits for the exit; after stopWait it kills the process. It
// returns how the process ended: nil for exit status 0.
func (p *process) Stop() error {
	defer untrack(p)
	defer p.afterOnce.Do(func() {
		if p.afterExit != nil {
			p.afterExit()
		}
	})
	select {
	case <-p.exited:
		return p.exitError()
	default:
	}
	_ = p.cmd.Process.Signal(p.stopSig)
	select {
	case <-p.exited:
	case <-time.After(stopWait):
		_ = p.cmd.Process.Kill()
		<-p.exited
		return fmt.Errorf("loadtest: %s did not stop within %s of %s and was killed", p.name, stopWait, p.stopSig)
	}
	return p.exitError()
}

func (p *process) exitError() error {
	if p.waitErr != nil {
		return fmt.Errorf("loadtest: %s exited with %v; see %s", p.name, p.waitErr, p.logPath)
	}
	return nil
}

// running are the started processes not stopped yet; the first one installs the handler that
// stops them all when the load test is interrupted.
var running struct {
	sync.Mutex
	procs map[*process]bool
	once  sync.Once
}

func track(p *process) {
	running.once.Do(func() {
		sig := make(chan os.Signal, 1)
		signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM)
		go func() {
			s := <-sig
			fmt.Fprintf(os.Stderr, "loadtest: %s: stopping the started processes\n", s)
			running.Lock()
			procs := slices.Collect(maps.Keys(running.procs))
			running.Unlock()
			for _, p := range procs {
				_ = p.Stop()
			}
			os.Exit(130)
		}()
	})
	running.Lock()
	defer running.Unlock()
	if running.procs == nil {
		running.procs = map[*process]bool{}
	}
	running.procs[p] = true
}

func untrack(p *process) {
	running.Lock()
	defer running.Unlock()
	delete(running.procs, p)
}

// freePort asks the kernel for a free loopback port.
func freePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("loadtest: cannot find a free port: %w", err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

// tail returns the last n lines of a file.
func tail(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return "(" + err.Error() + ")"
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}
