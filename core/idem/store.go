package idem

import "time"

// AttemptMemory is how long every store remembers a claim that ended
// without completing, for the next claim's Attempt.
const AttemptMemory = 24 * time.Hour
