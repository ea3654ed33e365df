package gateway

import (
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		// fasthttp's HostClient keeps one idle-connection cleaner per client until its idle
		// connections expire; the coarse clock of fasthttp runs for the process.
		goleak.IgnoreTopFunction("github.com/valyala/fasthttp.(*HostClient).connsCleaner"),
		goleak.IgnoreTopFunction("time.Sleep"),
		// The benchmarks' client uses fasthttp's default dialer, whose address cache cleaner is global.
		goleak.IgnoreTopFunction("github.com/valyala/fasthttp.(*TCPDialer).tcpAddrsClean"),
		goleak.IgnoreAnyFunction("github.com/valyala/fasthttp.updateServerDate.func1"),
	)
}
