//go:build !linux

package bench

import "time"

// processCPU is not measured off Linux; reports show 0.
func processCPU() time.Duration { return 0 }

// ProcessCPU is not measured off Linux; reports show 0.
func ProcessCPU(pid int) time.Duration { return 0 }

// loadAverage is not read off Linux; reports show none.
func loadAverage() string { return "" }
