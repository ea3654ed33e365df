package conf

import (
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/fsnotify/fsnotify"
	"github.com/knadh/koanf/parsers/yaml"
)

// The settle rule of -watch (SPEC 18): a burst of file-system events is over when none came for
// watchQuiet, and never waits longer than watchMaxDelay after its first event, so that a
// writer that never pauses (a log file in the same directory) still gets its changes read.
// 100 ms covers an editor's write-rename-chmod sequence and the kubelet's whole swap, which
// are microseconds apart.
const (
	watchQuiet    = 100 * time.Millisecond
	watchMaxDelay = time.Second
	// watchRetry is how soon a directory that could not be watched (removed, not yet mounted)
	// or a file-system watch that failed is tried again.
	watchRetry = time.Second
)

// Watcher reports changes to the content of a set of files: the config and routes files and
// the certificate files of -watch (SPEC 18).
//
// It watches the files' directories, not the files: a Kubernetes ConfigMap volume updates by
// writing a new timestamped directory and renaming a new `..data` symlink over the old one, so
// config.yaml (a symlink to ..data/config.yaml) never sees an event of its own; an editor or
// `mv` replaces the file's inode, which drops a watch held on the file. The directory of each
// path and the directory of the file it resolves to (through symlinks) are watched, and
// re-resolved after every change. An event is only a hint: after the events settle each file
// is read through its symlinks and its SHA-256 compared with the last one seen, and only the
// files whose content changed are reported, so a touch, a chmod or the kubelet's clean-up of
// the old directory is not a reload.
//
// Errors (a directory that cannot be watched, an inotify overflow) go to the onError function
// and the watch goes on: a directory is tried again every second, and an overflow, which may
// have lost events, re-reads every file.
type Watcher struct {
	onError func(error)
	changes chan []string
	retryCh chan struct{} // SetPaths asks the goroutine for a retry
	done    chan struct{}
	wg      sync.WaitGroup
	once    sync.Once

	mu    sync.Mutex
	fw    *fsnotify.Watcher    // nil after a failure, until it is re-created
	paths []string             // the watched files, as given
	sums  map[string]fileState // the content last seen, by path
}

// fileState is what a file held when last read: its SHA-256, or that it could not be read (a
// file that goes missing and comes back is two changes).
type fileState struct {
	sum      [sha256.Size]byte
	readable bool
}

// NewWatcher starts watching paths (duplicates and empty strings are dropped) and returns at
// once; the content the files hold now is the baseline. onError receives every error of the
// watch, which then goes on; it is called from the watcher's goroutines and must neither block
// nor call the Watcher. An
// error is returned only when the operating system's watch cannot be created; a directory that
// cannot be watched yet goes to onError and is retried. Close stops the watch.
func NewWatcher(paths []string, onError func(error)) (*Watcher, error) {
	fw, err := fsnotify.NewWatcher()
	if err != nil {
		return nil, fmt.Errorf("conf: watch: %w", err)
	}
	w := &Watcher{
		onError: onError,
		changes: make(chan []string, 1),
		retryCh: make(chan struct{}, 1),
		done:    make(chan struct{}),
		fw:      fw,
		sums:    make(map[string]fileState),
	}
	w.SetPaths(paths)
	w.wg.Add(1)
	go w.run()
	return w, nil
}

// Changes delivers, after each settled burst of events, the paths whose content changed. A
// receiver that is busy misses nothing: undelivered paths are merged into the next value.
func (w *Watcher) Changes() <-chan []string { return w.changes }

// SetPaths replaces the watched files (after a reload that names other certificate files); the
// content of a file new to the set is its baseline. A directory that cannot be watched goes to
// onError and is retried every second.
func (w *Watcher) SetPaths(paths []string) {
	var list []string
	for _, p := range paths {
		if p != "" && !slices.Contains(list, p) {
			list = append(list, p)
		}
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	sums := make(map[string]fileState, len(list))
	for _, p := range list {
		if s, ok := w.sums[p]; ok {
			sums[p] = s
		} else {
			sums[p] = readState(p)
		}
	}
	w.paths, w.sums = list, sums
	if !w.syncDirsLocked() {
		select {
		case w.retryCh <- struct{}{}:
		default: // a retry is already asked for
		}
	}
}

// Close stops the watch and waits for its goroutine; it is safe to call more than once.
func (w *Watcher) Close() error {
	w.once.Do(func() {
		close(w.done)
		w.wg.Wait()
	})
	return nil
}

func (w *Watcher) run() {
	defer w.wg.Done()
	defer func() {
		w.mu.Lock()
		if w.fw != nil {
			_ = w.fw.Close()
			w.fw = nil
		}
		w.mu.Unlock()
	}()

	settle := time.NewTimer(time.Hour)
	settle.Stop()
	retry := time.NewTimer(time.Hour)
	retry.Stop()
	defer settle.Stop()
	defer retry.Stop()
	var burst time.Time // first event of the burst being settled; zero when none is

	for {
		w.mu.Lock()
		fw := w.fw
		w.mu.Unlock()
		var events <-chan fsnotify.Event
		var errs <-chan error
		if fw != nil {
			events, errs = fw.Events, fw.Errors
		}
		select {
		case <-w.done:
			return
		case _, ok := <-events:
			if !ok {
				w.lost(errors.New("the file-system watch stopped"))
				retry.Reset(watchRetry)
				continue
			}
			now := time.Now()
			if burst.IsZero() {
				burst = now
			}
			settle.Reset(min(watchQuiet, max(0, watchMaxDelay-now.Sub(burst))))
		case err, ok := <-errs:
			if !ok {
				w.lost(errors.New("the file-system watch stopped"))
				retry.Reset(watchRetry)
				continue
			}
			w.onError(fmt.Errorf("conf: watch: %w", err))
			if errors.Is(err, fsnotify.ErrEventOverflow) {
				// Events were lost: read everything again.
				settle.Reset(0)
			}
		case <-settle.C:
			burst = time.Time{}
			if !w.check() {
				retry.Reset(watchRetry)
			}
		case <-retry.C:
			if !w.check() {
				retry.Reset(watchRetry)
			}
		case <-w.retryCh:
			retry.Reset(watchRetry)
		}
	}
}

// lost drops a file-system watch that stopped; the retry re-creates it.
func (w *Watcher) lost(err error) {
	w.onError(fmt.Errorf("conf: watch: %w; retrying", err))
	w.mu.Lock()
	if w.fw != nil {
		_ = w.fw.Close()
		w.fw = nil
	}
	w.mu.Unlock()
}

// check reads every file, reports those whose content changed and re-syncs the watched
// directories; it reports false when a directory or the watch itself needs a retry.
func (w *Watcher) check() bool {
	w.mu.Lock()
	var changed []string
	for _, p := range w.paths {
		s := readState(p)
		if s != w.sums[p] {
			w.sums[p] = s
			changed = append(changed, p)
		}
	}
	ok := w.syncDirsLocked()
	w.mu.Unlock()
	if len(changed) > 0 {
		w.notify(changed)
	}
	return ok
}

// notify hands changed to the receiver without blocking the watch: a value not yet received
// is taken back and merged (this goroutine is the only sender, so the send that follows has room).
func (w *Watcher) notify(changed []string) {
	select {
	case w.changes <- changed:
		return
	default:
	}
	select {
	case old := <-w.changes:
		for _, p := range old {
			if !slices.Contains(changed, p) {
				changed = append(changed, p)
			}
		}
	default:
	}
	w.changes <- changed
}

// syncDirsLocked makes the watched directories those of the paths and of their symlink
// targets, re-creating the file-system watch if it failed; false means something must be
// retried (each failure went to onError).
func (w *Watcher) syncDirsLocked() bool {
	select {
	case <-w.done:
		return true // closed: no watch to re-create (it would never be closed)
	default:
	}
	if w.fw == nil {
		fw, err := fsnotify.NewWatcher()
		if err != nil {
			w.onError(fmt.Errorf("conf: watch: %w", err))
			return false
		}
		w.fw = fw
	}
	want := make(map[string]bool)
	for _, p := range w.paths {
		if d, err := filepath.Abs(filepath.Dir(p)); err == nil {
			want[d] = true
		}
		// A symlink's target may sit elsewhere (certbot's live/ -> ../archive/): its directory
		// sees the writes. The kubelet's timestamped directory is watched too, harmlessly,
		// until the swap removes it.
		if r, err := filepath.EvalSymlinks(p); err == nil {
			if d, err := filepath.Abs(filepath.Dir(r)); err == nil {
				want[d] = true
			}
		}
	}
	ok := true
	have := w.fw.WatchList() // without the directories removed since: inotify dropped those
	for _, d := range have {
		if !want[d] {
			_ = w.fw.Remove(d) // the directory may be gone already
		}
	}
	for d := range want {
		if slices.Contains(have, d) {
			continue
		}
		if err := w.fw.Add(d); err != nil {
			w.onError(fmt.Errorf("conf: watch %s: %w; retrying every %s", d, err, watchRetry))
			ok = false
		}
	}
	return ok
}

// readState reads path through its symlinks and hashes it.
func readState(path string) fileState {
	b, err := os.ReadFile(path)
	if err != nil {
		return fileState{}
	}
	return fileState{sum: sha256.Sum256(b), readable: true}
}

var _ io.Closer = (*Watcher)(nil)

// NamedFiles returns the files that the given configuration files name, as written: every
// string under a key ending in _file (certificates, keys, CA bundles, and any file a later key
// names), at any depth, and every string in a list under such a key. The files are read
// leniently, without validation, so that a configuration that is refused (a certificate it
// names has not arrived yet) still tells -watch which files to watch (SPEC 18). A file that
// cannot be read or parsed names nothing.
func NamedFiles(files ...string) []string {
	var out []string
	seen := map[string]bool{}
	var walk func(key string, v any)
	walk = func(key string, v any) {
		switch x := v.(type) {
		case map[string]any:
			for k, e := range x {
				walk(k, e)
			}
		case []any:
			for _, e := range x {
				walk(key, e)
			}
		case string:
			if strings.HasSuffix(key, "_file") && x != "" && !seen[x] {
				seen[x] = true
				out = append(out, x)
			}
		}
	}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		raw, err := yaml.Parser().Unmarshal(b)
		if err != nil {
			continue
		}
		walk("", raw)
	}
	slices.Sort(out)
	return out
}
