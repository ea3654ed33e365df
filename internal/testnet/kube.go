package testnet

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
)

// KubeVolume lays out a directory the way the kubelet's atomic writer updates a ConfigMap
// volume: the data in a timestamped directory, a `..data` symlink to it, and each key a symlink
// through `..data`. Publish writes a new timestamped directory, renames a new symlink over
// `..data` (the one atomic step) and removes the old directory.
type KubeVolume struct {
	// Dir is the volume's directory; Cur the timestamped directory ..data points to.
	Dir string
	Cur string
	// Keep leaves the old directory for the test to remove (a cleanup that comes late).
	Keep bool
	n    int
}

// Publish makes files (name to content) the volume's content, in one swap of ..data.
func (k *KubeVolume) Publish(t testing.TB, files map[string]string) {
	t.Helper()
	old := k.Cur
	k.n++
	ts := fmt.Sprintf("..2026_12_01_08_00_%02d.%09d", k.n, 123456789+k.n)
	if err := os.Mkdir(filepath.Join(k.Dir, ts), 0o755); err != nil {
		t.Fatal(err)
	}
	for name, content := range files {
		if err := os.WriteFile(filepath.Join(k.Dir, ts, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	tmp := filepath.Join(k.Dir, "..data_tmp")
	if err := os.Symlink(ts, tmp); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(k.Dir, "..data")); err != nil {
		t.Fatal(err)
	}
	for name := range files {
		link := filepath.Join(k.Dir, name)
		if _, err := os.Lstat(link); os.IsNotExist(err) {
			if err := os.Symlink(filepath.Join("..data", name), link); err != nil {
				t.Fatal(err)
			}
		}
	}
	k.Cur = ts
	if old != "" && !k.Keep {
		k.RemoveDir(t, old)
	}
}

// RemoveDir removes the timestamped directory name of the volume.
func (k *KubeVolume) RemoveDir(t testing.TB, name string) {
	t.Helper()
	if err := os.RemoveAll(filepath.Join(k.Dir, name)); err != nil {
		t.Fatal(err)
	}
}
