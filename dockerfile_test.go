package main

import (
	"encoding/json"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// dockerInstr is one instruction of a Dockerfile: its keyword (upper case) and its arguments,
// continuation lines joined.
type dockerInstr struct {
	cmd, args string
	line      int
}

// dockerStage is one FROM and the instructions under it.
type dockerStage struct {
	from, name string
	instrs     []dockerInstr
}

func (s dockerStage) all(cmd string) []dockerInstr {
	var out []dockerInstr
	for _, in := range s.instrs {
		if in.cmd == cmd {
			out = append(out, in)
		}
	}
	return out
}

// parseDockerfile splits a Dockerfile into stages. It knows the shape of ours: comments, blank
// lines, backslash continuations, "FROM image [AS name]"; no parser directive but the syntax one.
func parseDockerfile(t *testing.T, src string) []dockerStage {
	t.Helper()
	var stages []dockerStage
	var cur strings.Builder
	start := 0
	flush := func() {
		text := strings.TrimSpace(cur.String())
		cur.Reset()
		if text == "" {
			return
		}
		cmd, args, _ := strings.Cut(text, " ")
		in := dockerInstr{cmd: strings.ToUpper(cmd), args: strings.TrimSpace(args), line: start}
		if in.cmd == "FROM" {
			f := strings.Fields(in.args)
			st := dockerStage{from: f[0]}
			if len(f) == 3 && strings.EqualFold(f[1], "AS") {
				st.name = f[2]
			}
			stages = append(stages, st)
			return
		}
		if len(stages) == 0 {
			t.Fatalf("Dockerfile:%d: %s before the first FROM", in.line, in.cmd)
		}
		stages[len(stages)-1].instrs = append(stages[len(stages)-1].instrs, in)
	}
	for i, line := range strings.Split(src, "\n") {
		trimmed := strings.TrimSpace(line)
		if trimmed == "" || strings.HasPrefix(trimmed, "#") {
			continue
		}
		if cur.Len() == 0 {
			start = i + 1
		}
		if body, ok := strings.CutSuffix(trimmed, "\\"); ok {
			cur.WriteString(body + " ")
			continue
		}
		cur.WriteString(trimmed)
		flush()
	}
	flush()
	return stages
}

// TestDockerfile checks what can be checked of the image without a container runtime (there
// is none on the build machines): a multi-stage build of a CGO_ENABLED=0 binary with a Go at
// least go.mod's, a minimal final image with CA certificates and a passwd entry, a numeric
// non-root USER, the two files under /etc/toron, EXPOSE 8080, and an exec-form ENTRYPOINT
// with -watch and the /etc/toron paths.
func TestDockerfile(t *testing.T) {
	src, err := os.ReadFile("Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	stages := parseDockerfile(t, string(src))
	if len(stages) < 2 {
		t.Fatalf("%d stages, want a multi-stage build", len(stages))
	}
	build, final := stages[0], stages[len(stages)-1]

	// The builder's Go is at least the go directive of go.mod.
	gomod, err := os.ReadFile("go.mod")
	if err != nil {
		t.Fatal(err)
	}
	want := regexp.MustCompile(`(?m)^go (\d+)\.(\d+)`).FindStringSubmatch(string(gomod))
	got := regexp.MustCompile(`^golang:(\d+)\.(\d+)`).FindStringSubmatch(build.from)
	if got == nil {
		t.Errorf("build stage FROM %s: want a golang:X.Y image", build.from)
	} else if atoi(got[1]) < atoi(want[1]) || atoi(got[1]) == atoi(want[1]) && atoi(got[2]) < atoi(want[2]) {
		t.Errorf("build stage FROM %s is older than go.mod's go %s.%s", build.from, want[1], want[2])
	}
	if build.name == "" {
		t.Error("the build stage has no name (FROM ... AS build) for COPY --from")
	}
	var static bool
	for _, in := range build.all("RUN") {
		if strings.Contains(in.args, "go build") && strings.Contains(in.args, "CGO_ENABLED=0") {
			static = true
		}
	}
	if !static {
		t.Error("no RUN with CGO_ENABLED=0 go build in the build stage")
	}

	// A minimal final image: distroless static, or scratch with what distroless brings.
	copies := strings.Join(func() []string {
		var a []string
		for _, in := range final.all("COPY") {
			a = append(a, in.args)
		}
		return a
	}(), "\n")
	switch {
	case strings.HasPrefix(final.from, "gcr.io/distroless/static"):
	case final.from == "scratch":
		for _, need := range []string{"ca-certificates", "/etc/passwd"} {
			if !strings.Contains(copies, need) {
				t.Errorf("FROM scratch without a COPY of %s", need)
			}
		}
	default:
		t.Errorf("final stage FROM %s: want gcr.io/distroless/static* or scratch", final.from)
	}
	if !strings.Contains(copies, "--from="+build.name) {
		t.Errorf("the final stage copies nothing from the %s stage", build.name)
	}
	if !strings.Contains(copies, "/etc/toron") {
		t.Error("the final stage puts nothing in /etc/toron")
	}

	users := final.all("USER")
	if len(users) == 0 {
		t.Fatal("no USER in the final stage: the image would run as root")
	}
	user := users[len(users)-1].args
	uid, gid, hasGID := strings.Cut(user, ":")
	n, err := strconv.Atoi(uid)
	switch {
	case err != nil:
		t.Errorf("USER %s: want a numeric uid (Kubernetes cannot check runAsNonRoot on a name)", user)
	case n == 0:
		t.Errorf("USER %s is root", user)
	}
	if hasGID {
		if _, err := strconv.Atoi(gid); err != nil {
			t.Errorf("USER %s: want a numeric gid", user)
		}
	}

	var exposed bool
	for _, in := range final.all("EXPOSE") {
		if slices.Contains(strings.Fields(in.args), "8080") || slices.Contains(strings.Fields(in.args), "8080/tcp") {
			exposed = true
		}
	}
	if !exposed {
		t.Error("no EXPOSE 8080 in the final stage")
	}

	entries := final.all("ENTRYPOINT")
	if len(entries) != 1 {
		t.Fatalf("%d ENTRYPOINTs in the final stage, want 1", len(entries))
	}
	var argv []string
	if err := json.Unmarshal([]byte(entries[0].args), &argv); err != nil {
		// The shell form needs a shell the image does not have, and would not pass SIGTERM on.
		t.Fatalf("ENTRYPOINT %s is not the exec (JSON) form: %v", entries[0].args, err)
	}
	argv = append(argv, func() []string {
		var a []string
		for _, in := range final.all("CMD") {
			var c []string
			if json.Unmarshal([]byte(in.args), &c) == nil {
				a = append(a, c...)
			}
		}
		return a
	}()...)
	for _, want := range [][]string{{"-watch"}, {"-config", "/etc/toron/config.yaml"}, {"-routes", "/etc/toron/routes.yaml"}} {
		i := slices.Index(argv, want[0])
		if i < 0 || len(want) == 2 && (i+1 >= len(argv) || argv[i+1] != want[1]) {
			t.Errorf("the entrypoint %v lacks %v", argv, want)
		}
	}
	if len(argv) == 0 || !strings.HasSuffix(argv[0], "/toron") {
		t.Errorf("the entrypoint %v does not start the toron binary", argv)
	}
}

func atoi(s string) int { n, _ := strconv.Atoi(s); return n }
