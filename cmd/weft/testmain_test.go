package main

import (
	"context"
	"encoding/json"
	"os"
	"os/signal"
	"syscall"
	"testing"
)

// childArgsEnv, when set (JSON of the arguments), makes the test binary run the command line
// as weft's main would, signals included, instead of the tests: the tests that stop a
// `weft cluster up` with SIGTERM re-execute themselves (cluster_unix_test.go).
const childArgsEnv = "WEFT_TEST_WEFT_ARGS"

func TestMain(m *testing.M) {
	if a := os.Getenv(childArgsEnv); a != "" {
		var args []string
		if err := json.Unmarshal([]byte(a), &args); err != nil {
			os.Stderr.WriteString("bad " + childArgsEnv + ": " + err.Error() + "\n")
			os.Exit(2)
		}
		ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
		code := run(ctx, args, os.Stdout, os.Stderr)
		stop()
		os.Exit(code)
	}
	os.Exit(m.Run())
}
