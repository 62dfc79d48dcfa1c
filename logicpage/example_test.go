package logicpage_test

import (
	"fmt"

	"github.com/weftdb/weft/base"
	"github.com/weftdb/weft/logicpage"
)

// Rows 3, 4 and 9 of page 0 travel from one frame to another as a sparse segment, and row 5 is
// deleted on the way.
func ExampleFrame_Gather() {
	g, err := logicpage.NewGeometry(8)
	if err != nil {
		panic(err)
	}
	slab := logicpage.AlignedBytes(2 * g.PageBytes()) // two frames in one slab
	masks := make([]logicpage.Masks, 2)
	src := g.Frame(slab[:g.PageBytes()], &masks[0])
	dst := g.Frame(slab[g.PageBytes():], &masks[1])
	copy(src.Row(3), "three...")
	copy(src.Row(4), "four....")
	copy(src.Row(9), "nine....")
	copy(dst.Row(5), "five....")
	dst.Masks.Present = 1 << 5

	const data = 1<<3 | 1<<4 | 1<<9
	slices := src.Gather(data, nil) // [rows 3..4] [row 9]: aliases of src, no copy
	var rows []byte
	for _, s := range slices {
		rows = append(rows, s...) // what the wire does
	}
	seg := base.Segment{Page: 0, Data: data, Clear: 1 << 5, Rows: rows}
	if err := g.CheckSegment(seg); err != nil {
		panic(err)
	}
	dst.Apply(seg)

	fmt.Println(len(slices), "slices")
	fmt.Printf("present %#x\n", dst.Masks.Present)
	fmt.Printf("%q %q %q\n", dst.Row(3), dst.Row(9), dst.Row(5))
	// Output:
	// 2 slices
	// present 0x218
	// "three..." "nine...." "\x00\x00\x00\x00\x00\x00\x00\x00"
}

func ExamplePageOf() {
	page, slot := logicpage.PageOf(1000)
	fmt.Println(page, slot, logicpage.RowID(page, slot))
	// Output: 15 40 1000
}
