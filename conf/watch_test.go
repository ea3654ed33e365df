package conf

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
	"toron/internal/testnet"
)

// The watch tests use real directories and the real inotify watch. Bounds are generous: a
// change must arrive within changeWait (the rule is at most 1 s after the first event), and
// "nothing arrives" is judged over quietWait, well beyond the settle time.
const (
	changeWait = 5 * time.Second
	quietWait  = 1500 * time.Millisecond
)

// watchErrors collects what a Watcher passes to onError.
type watchErrors struct {
	mu   sync.Mutex
	errs []error
}

func (e *watchErrors) add(err error) { e.mu.Lock(); e.errs = append(e.errs, err); e.mu.Unlock() }

func (e *watchErrors) count() int { e.mu.Lock(); defer e.mu.Unlock(); return len(e.errs) }

func startWatcher(t *testing.T, paths ...string) (*Watcher, *watchErrors) {
	t.Helper()
	errs := &watchErrors{}
	w, err := NewWatcher(paths, errs.add)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { w.Close() })
	return w, errs
}

// wantChange waits for the next value of w.Changes and checks it names exactly want.
func wantChange(t *testing.T, w *Watcher, want ...string) {
	t.Helper()
	select {
	case got := <-w.Changes():
		slices.Sort(got)
		slices.Sort(want)
		if !slices.Equal(got, want) {
			t.Fatalf("changed %v, want %v", got, want)
		}
	case <-time.After(changeWait):
		t.Fatalf("no change reported within %s, want %v", changeWait, want)
	}
}

func wantNoChange(t *testing.T, w *Watcher, what string) {
	t.Helper()
	select {
	case got := <-w.Changes():
		t.Fatalf("%s: reported %v as changed", what, got)
	case <-time.After(quietWait):
	}
}

func write(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

// writeAndWatch writes each file (path, then content) and watches them.
func writeAndWatch(t *testing.T, files ...string) (*Watcher, *watchErrors) {
	t.Helper()
	var paths []string
	for i := 0; i+1 < len(files); i += 2 {
		write(t, files[i], files[i+1])
		paths = append(paths, files[i])
	}
	return startWatcher(t, paths...)
}

// watchOne writes content to config.yaml in a new directory and watches it alone.
func watchOne(t *testing.T, content string) (dir, cfg string, w *Watcher) {
	t.Helper()
	dir = t.TempDir()
	cfg = filepath.Join(dir, "config.yaml")
	w, _ = writeAndWatch(t, cfg, content)
	return dir, cfg, w
}

// renameOver writes content to a temporary file beside path and renames it over path, as
// editors, `mv` and configuration-management tools do.
func renameOver(t *testing.T, path, content string) {
	t.Helper()
	tmp := filepath.Join(filepath.Dir(path), "."+filepath.Base(path)+".tmp")
	write(t, tmp, content)
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

// TestWatchKubeletDataSwap: a ConfigMap update never touches config.yaml itself (a symlink
// through ..data): the swap of ..data in the directory is seen, and only the file whose content
// changed is reported, not the one the kubelet rewrote with the same bytes.
func TestWatchKubeletDataSwap(t *testing.T) {
	k := &testnet.KubeVolume{Dir: t.TempDir()}
	k.Publish(t, map[string]string{"config.yaml": "server: {}\n", "routes.yaml": "routes: []\n"})
	cfg, routes := filepath.Join(k.Dir, "config.yaml"), filepath.Join(k.Dir, "routes.yaml")
	w, errs := startWatcher(t, cfg, routes)

	k.Publish(t, map[string]string{"config.yaml": "server: {port: 9090}\n", "routes.yaml": "routes: []\n"})
	wantChange(t, w, cfg)
	wantNoChange(t, w, "after the swap settled (old directory removed)")

	k.Publish(t, map[string]string{"config.yaml": "server: {port: 9090}\n", "routes.yaml": "routes: [{}]\n"})
	wantChange(t, w, routes)
	k.Publish(t, map[string]string{"config.yaml": "server: {}\n", "routes.yaml": "routes: []\n"})
	wantChange(t, w, cfg, routes)
	if n := errs.count(); n != 0 {
		t.Errorf("%d watch errors: %v", n, errs.errs)
	}
}

// TestWatchKubeletSwapAlone: the ..data rename alone, with the old directory still there
// (its removal comes later, or fails), is the change: config.yaml and the file it used to
// resolve to see no event of their own, only the directory does.
func TestWatchKubeletSwapAlone(t *testing.T) {
	k := &testnet.KubeVolume{Dir: t.TempDir(), Keep: true}
	k.Publish(t, map[string]string{"config.yaml": "a\n"})
	first := k.Cur
	cfg := filepath.Join(k.Dir, "config.yaml")
	w, _ := startWatcher(t, cfg)

	k.Publish(t, map[string]string{"config.yaml": "b\n"})
	wantChange(t, w, cfg)
	k.RemoveDir(t, first)
	wantNoChange(t, w, "the late removal of the old directory")
}

// TestWatchRenameOverAndInPlace: a file replaced by a rename (a new inode, which drops a watch
// held on the file itself) and a file rewritten in place are both seen.
func TestWatchRenameOverAndInPlace(t *testing.T) {
	dir := t.TempDir()
	cfg, routes := filepath.Join(dir, "config.yaml"), filepath.Join(dir, "routes.yaml")
	w, _ := writeAndWatch(t, cfg, "a\n", routes, "r\n")

	renameOver(t, cfg, "b\n")
	wantChange(t, w, cfg)
	renameOver(t, cfg, "c\n")
	wantChange(t, w, cfg)
	write(t, routes, "r2\n")
	wantChange(t, w, routes)
}

// TestWatchSameContentIsNoChange: events without a content change (the same bytes renamed
// over, a chmod, another file of the directory) report nothing; a real change afterwards
// still does.
func TestWatchSameContentIsNoChange(t *testing.T) {
	dir, cfg, w := watchOne(t, "a\n")

	renameOver(t, cfg, "a\n")
	if err := os.Chmod(cfg, 0o600); err != nil {
		t.Fatal(err)
	}
	write(t, filepath.Join(dir, "notes.txt"), "unrelated\n")
	wantNoChange(t, w, "same content")
	renameOver(t, cfg, "b\n")
	wantChange(t, w, cfg)
}

// TestWatchThirdFileInAnotherDirectory: a watched file beside neither the config nor the
// routes (a certificate in its own directory) is watched as well.
func TestWatchThirdFileInAnotherDirectory(t *testing.T) {
	dir, certDir := t.TempDir(), t.TempDir()
	cfg, cert := filepath.Join(dir, "config.yaml"), filepath.Join(certDir, "tls.crt")
	w, _ := writeAndWatch(t, cfg, "a\n", cert, "cert 1\n")

	renameOver(t, cert, "cert 2\n")
	wantChange(t, w, cert)
}

// TestWatchSymlinkTargetDirectory: a file that is a symlink into another directory (certbot's
// live/ -> ../archive/) is seen changing when its target is rewritten in place.
func TestWatchSymlinkTargetDirectory(t *testing.T) {
	live, archive := t.TempDir(), t.TempDir()
	target := filepath.Join(archive, "cert1.pem")
	write(t, target, "cert 1\n")
	link := filepath.Join(live, "cert.pem")
	if err := os.Symlink(target, link); err != nil {
		t.Fatal(err)
	}
	w, _ := startWatcher(t, link)

	write(t, target, "cert 1 renewed\n")
	wantChange(t, w, link)
}

// TestWatchGoesOnAfterErrors: a file that disappears is a change (the reload then fails on it);
// a directory that disappears is an error, retried until it is back; the watch goes on through
// both and reports the files when they return.
func TestWatchGoesOnAfterErrors(t *testing.T) {
	dir, certDir := t.TempDir(), filepath.Join(t.TempDir(), "certs")
	if err := os.Mkdir(certDir, 0o755); err != nil {
		t.Fatal(err)
	}
	cfg, cert := filepath.Join(dir, "config.yaml"), filepath.Join(certDir, "tls.crt")
	w, errs := writeAndWatch(t, cfg, "a\n", cert, "c\n")

	if err := os.Remove(cfg); err != nil {
		t.Fatal(err)
	}
	wantChange(t, w, cfg)
	write(t, cfg, "a\n")
	wantChange(t, w, cfg)

	if err := os.RemoveAll(certDir); err != nil {
		t.Fatal(err)
	}
	wantChange(t, w, cert)
	deadline := time.Now().Add(changeWait)
	for errs.count() == 0 {
		if time.Now().After(deadline) {
			t.Fatal("a directory that cannot be watched is not reported")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err := os.Mkdir(certDir, 0o755); err != nil {
		t.Fatal(err)
	}
	write(t, cert, "c2\n")
	wantChange(t, w, cert)
	// Once back, the directory is watched again, not only polled by the retry.
	time.Sleep(2 * watchRetry)
	renameOver(t, cert, "c3\n")
	wantChange(t, w, cert)
}

// TestWatchSettlesWithinOneSecond: a writer that never pauses in the same directory does not
// hold a change back beyond the settle bound.
func TestWatchSettlesWithinOneSecond(t *testing.T) {
	dir, cfg, w := watchOne(t, "a\n")

	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		noise := filepath.Join(dir, "busy.log")
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			case <-time.After(10 * time.Millisecond):
			}
			_ = os.WriteFile(noise, fmt.Appendf(nil, "%d\n", i), 0o644)
		}
	}()
	defer func() { close(stop); wg.Wait() }()

	time.Sleep(200 * time.Millisecond) // the noise is flowing
	renameOver(t, cfg, "b\n")
	select {
	case got := <-w.Changes():
		if !slices.Equal(got, []string{cfg}) {
			t.Fatalf("changed %v, want [%s]", got, cfg)
		}
	case <-time.After(4 * time.Second):
		t.Fatal("a change was held back while another file of the directory kept changing")
	}
}

// TestWatchSetPaths: a file added by SetPaths (the certificate of a reloaded TLS section) is
// watched from its content at that moment; a file dropped is no longer reported.
func TestWatchSetPaths(t *testing.T) {
	dir, other := t.TempDir(), t.TempDir()
	cfg, cert := filepath.Join(dir, "config.yaml"), filepath.Join(other, "new.crt")
	write(t, cfg, "a\n")
	write(t, cert, "c\n")
	w, _ := startWatcher(t, cfg)

	w.SetPaths([]string{cert, "", cert})
	renameOver(t, cfg, "b\n")
	renameOver(t, cert, "c2\n")
	wantChange(t, w, cert)
	wantNoChange(t, w, "a file dropped from the set")
}

// TestWatchMergesUndelivered: changes found while the receiver is busy are merged into the
// value it has not taken yet.
func TestWatchMergesUndelivered(t *testing.T) {
	w := &Watcher{changes: make(chan []string, 1)}
	w.notify([]string{"a"})
	w.notify([]string{"b", "a"})
	got := <-w.Changes()
	slices.Sort(got)
	if !slices.Equal(got, []string{"a", "b"}) {
		t.Fatalf("got %v, want [a b]", got)
	}
	select {
	case more := <-w.Changes():
		t.Fatalf("a second value %v", more)
	default:
	}
}

// TestWatchCloseStops: Close ends the goroutine (goleak checks it for the package) and may be
// called twice.
func TestWatchCloseStops(t *testing.T) {
	dir := t.TempDir()
	cfg := filepath.Join(dir, "config.yaml")
	write(t, cfg, "a\n")
	w, err := NewWatcher([]string{cfg}, func(error) {})
	if err != nil {
		t.Fatal(err)
	}
	renameOver(t, cfg, "b\n")
	w.Close()
	w.Close()
	w.SetPaths([]string{cfg, filepath.Join(dir, "other.yaml")}) // after Close: no new watch to leak
}

// TestWatchSetPathsRetriesMissingDirectory: a file whose directory does not exist yet (a
// certificate volume mounted later) is an error, retried until the directory appears.
func TestWatchSetPathsRetriesMissingDirectory(t *testing.T) {
	dir := t.TempDir()
	// The certificate's parent is not watched either: only the retry can find it.
	cfg, cert := filepath.Join(dir, "config.yaml"), filepath.Join(t.TempDir(), "certs", "tls.crt")
	write(t, cfg, "a\n")
	w, errs := startWatcher(t, cfg)
	w.SetPaths([]string{cfg, cert})
	if errs.count() == 0 {
		t.Fatal("a directory that cannot be watched is not reported")
	}
	if err := os.Mkdir(filepath.Dir(cert), 0o755); err != nil {
		t.Fatal(err)
	}
	write(t, cert, "c\n")
	wantChange(t, w, cert)
}

// TestNamedFiles: the files a configuration names are found without validating it (a refused
// one names its files too), at any depth; a file that does not parse names nothing.
func TestNamedFiles(t *testing.T) {
	dir := t.TempDir()
	cfg := filepath.Join(dir, "config.yaml")
	routes := filepath.Join(dir, "routes.yaml")
	bad := filepath.Join(dir, "bad.yaml")
	for f, s := range map[string]string{
		cfg:    "server:\n  tls:\n    certs:\n      - {cert_file: /s/a.crt, key_file: /s/a.key}\n      - {cert_file: /s/b.crt, key_file: /s/b.key}\n    client_ca_file: /s/ca.pem\n  read_timeout: -5s\n",
		routes: "routes:\n  - {type: upstream, prefix: /a, target: https://x:1, tls_ca_file: /s/up.pem}\n  - {type: upstream, prefix: /b, target: https://x:1, tls_ca_file: /s/up.pem, auth: {htpasswd_file: /s/users}}\n",
		bad:    "server: {tls: [\n",
	} {
		if err := os.WriteFile(f, []byte(s), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	got := strings.Join(NamedFiles(cfg, routes, bad, filepath.Join(dir, "missing.yaml")), " ")
	if want := "/s/a.crt /s/a.key /s/b.crt /s/b.key /s/ca.pem /s/up.pem /s/users"; got != want {
		t.Errorf("NamedFiles: %s\nwant %s", got, want)
	}
}
