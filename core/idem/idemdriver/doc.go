// Package idemdriver is what idempotency stores implement and what
// integrations build on; users of package idem never need it, as users of
// database/sql never need database/sql/driver.
//
// A store implements Store (Begin, Complete, Abandon, Extend over a Key
// and a Claim), and where it can, EffectStore (an effect committed with
// the record), Waiter (a duplicate woken when the key changes), Inspector
// and Lister (for operators, oncectl). Every oncekit driver runs
// idemtest's conformance suite against them.
//
// An integration — a middleware, a job runner — derives its stored keys
// with StoredKey (ScopedKey, KafkaScope), checks client keys with
// CheckClientKey, fingerprints JSON bodies with CanonicalJSON, and marks
// the context it passes to idem.Guard.Do: AnswersOnReturn,
// ClaimOutlivesCaller, ContextWithWait.
package idemdriver
