package txnode

import (
	"os"
	"testing"
)

// soak reports whether WEFT_SOAK asks for a soak run (as storenode's and storenode/server's
// harnesses do).
func soak() bool { return os.Getenv("WEFT_SOAK") != "" && os.Getenv("WEFT_SOAK") != "0" }

// scaled returns the size of a randomised or load suite: short under -short (the -race pass),
// normal in the plain pass of .ci/run, soakSize under WEFT_SOAK.
func scaled(short, normal, soakSize int) int {
	switch {
	case soak():
		return soakSize
	case testing.Short():
		return short
	}
	return normal
}
