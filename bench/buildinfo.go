package bench

import (
	"os/exec"
	"runtime/debug"
	"strings"
)

// sourceCommit names the source a report was measured on: the VCS stamp the Go toolchain put
// in the binary (go build, go install), else `git` in the working directory (go run, go test,
// which do not stamp), else "unknown" with the reason. A "-dirty" suffix marks uncommitted
// changes. Called once per run, never on a measured path.
func sourceCommit() string {
	if info, ok := debug.ReadBuildInfo(); ok {
		if c, ok := vcsStamp(info.Settings); ok {
			return c
		}
	}
	out, err := exec.Command("git", "rev-parse", "--short=12", "HEAD").Output()
	if err != nil {
		return "unknown (no VCS stamp in the binary, and git rev-parse failed: " + commandError(err) + ")"
	}
	commit := strings.TrimSpace(string(out))
	if st, err := exec.Command("git", "status", "--porcelain", "--untracked-files=no").Output(); err == nil && len(st) > 0 {
		commit += "-dirty"
	}
	return commit
}

// vcsStamp reads vcs.revision and vcs.modified from build settings.
func vcsStamp(settings []debug.BuildSetting) (string, bool) {
	var rev string
	modified := false
	for _, s := range settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.modified":
			modified = s.Value == "true"
		}
	}
	if rev == "" {
		return "", false
	}
	if len(rev) > 12 {
		rev = rev[:12]
	}
	if modified {
		rev += "-dirty"
	}
	return rev, true
}

// commandError is the first line of a failed command's stderr, or its error.
func commandError(err error) string {
	if ee, ok := err.(*exec.ExitError); ok && len(ee.Stderr) > 0 {
		line, _, _ := strings.Cut(strings.TrimSpace(string(ee.Stderr)), "\n")
		return line
	}
	return err.Error()
}
