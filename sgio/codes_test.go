package sgio

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strings"
	"syscall"
	"testing"
	"unicode/utf8"

	"github.com/stretchr/testify/require"

	"github.com/weftdb/weft/base"
	"github.com/weftdb/weft/internal/corrupt"
)

// Every code maps to one sentinel and back, and the sentinel survives the wire.
func TestCodesRoundTrip(t *testing.T) {
	seen := map[error]Code{}
	for _, e := range base.Codes() {
		require.NotZero(t, e.Code)
		_, dup := seen[e.Err]
		require.False(t, dup, "sentinel of %d used twice", e.Code)
		seen[e.Err] = e.Code

		require.Equal(t, e.Err, e.Code.Err())
		require.Equal(t, e.Code, CodeOf(e.Err), "%v", e.Err)
		wrapped := fmt.Errorf("storenode: commit of owner 3: %w", e.Err)
		require.Equal(t, e.Code, CodeOf(wrapped))

		// Across the wire: encode an Error reply, decode it, and the sentinel still matches.
		frame := AppendFrame(nil, 1, NewErrorReply(wrapped))
		f, _, err := Decode(frame, MaxBodyLimit)
		require.NoError(t, err)
		var reply ErrorReply
		require.NoError(t, reply.Parse(f.Body))
		remote := reply.Err()
		require.ErrorIs(t, remote, e.Err)
		require.Equal(t, wrapped.Error(), remote.Error(), "the server's message text")
		require.Equal(t, e.Code, CodeOf(remote), "a remote error passes through unchanged")
		if e.Code != CodeCorruption && e.Code != CodeMalformed {
			require.False(t, errors.Is(remote, corrupt.ErrCorruption), "%v", e.Code)
		}
		require.True(t, strings.HasPrefix(e.Code.String(), "sgio: ") || e.Code == CodeCorruption)
	}
	require.Len(t, seen, int(CodeTxnBusy)+2, "codes 1..CodeTxnBusy and the move range 40..41 are all used")
}

func TestCodeOf(t *testing.T) {
	cases := []struct {
		err  error
		code Code
	}{
		{nil, CodeInternal},
		{errors.New("anything"), CodeInternal},
		{corrupt.Errorf("wal: record at %d: bad crc", 4096), CodeCorruption},
		{ErrChecksum, CodeCorruption},
		{ErrBadMagic, CodeCorruption},
		{ErrTruncated, CodeMalformed},
		{ErrBadVersion, CodeUnsupported},
		{ErrUnknownType, CodeUnsupported},
		{&fs.PathError{Op: "write", Path: "wal/000001", Err: syscall.ENOSPC}, CodeNoSpace},
		{fmt.Errorf("sgio: CreateTable body: %w: %w", ErrBadName, ErrMalformed), CodeBadName},
		{fmt.Errorf("%w: %w", ErrUnknownOutcome, ErrConnClosed), CodeUnknownOutcome},
		{os.ErrClosed, CodeInternal},
	}
	for _, c := range cases {
		require.Equal(t, c.code, CodeOf(c.err), "%v", c.err)
	}
	require.ErrorIs(t, ErrNoSpace, syscall.ENOSPC)
	require.ErrorIs(t, ErrorFromWire(CodeNoSpace, "disk full"), syscall.ENOSPC)
}

func TestErrorFromWire(t *testing.T) {
	err := ErrorFromWire(CodeTableNotFound, "storenode: table \"x\" not found")
	require.ErrorIs(t, err, ErrTableNotFound)
	require.EqualError(t, err, "storenode: table \"x\" not found")
	var re *RemoteError
	require.ErrorAs(t, err, &re)
	require.Equal(t, CodeTableNotFound, re.Code)

	require.EqualError(t, ErrorFromWire(CodeFenced, ""), ErrFenced.Error(), "empty message: the sentinel's")

	unknown := ErrorFromWire(999, "from a newer server")
	require.ErrorIs(t, unknown, ErrInternal)
	require.ErrorAs(t, unknown, &re)
	require.Equal(t, Code(999), re.Code, "the number survives")
	require.Equal(t, "sgio: error code 999", Code(999).String())

	require.ErrorIs(t, ErrorFromWire(CodeCorruption, "page 7: checksum"), corrupt.ErrCorruption)
}

func TestNewErrorReplyCutsLongMessages(t *testing.T) {
	long := errors.New(strings.Repeat("ü", ErrorMessageMax)) // 2 bytes a rune
	r := NewErrorReply(fmt.Errorf("x%w", long))              // odd offset: the cut lands mid-rune
	require.LessOrEqual(t, len(r.Message), ErrorMessageMax)
	require.True(t, utf8.ValidString(r.Message))
	require.NoError(t, r.Validate())
	require.Equal(t, CodeInternal, NewErrorReply(nil).Code)
}
