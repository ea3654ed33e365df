package main

import (
	"os"
	"testing"
	"time"

	"toron/internal/testnet"
)

func TestServerClosedSeesThePeerClose(t *testing.T) {
	client, server := testnet.Pair(t)
	if _, err := os.Stat("/proc/net/tcp"); err != nil {
		server.Close()
		t.Skip("no /proc/net/tcp")
	}
	if serverClosed(client) {
		t.Fatal("an open connection reads as closed")
	}
	server.Close()
	if !waitFor(2*time.Second, func() bool { return serverClosed(client) }) {
		t.Fatal("the peer's close was not seen")
	}
}
