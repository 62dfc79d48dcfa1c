//go:build race

package testkit

// RaceOn reports a build with the race detector.
const RaceOn = true
