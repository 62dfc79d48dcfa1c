package base

// Stat is one named counter of a node, as the engine lists it and the wire carries it. Its
// name passes sgio.CheckName.
type Stat struct {
	Name  string
	Value uint64
}
