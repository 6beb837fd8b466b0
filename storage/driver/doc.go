// Package driver is the contract between storage.Open and the drivers:
// the Store interface every driver implements, and the registry of URL
// schemes. Applications do not need it; a driver author does (see
// CONTRIBUTING.md for the checklist).
//
// A driver registers its schemes in an init function:
//
//	func init() { driver.Register(openURL, "redis", "rediss") }
//
// so that a program links only the drivers it imports: importing
// storage/redisstore makes storage.Open take redis:// URLs, and importing
// storage/all makes it take every form. The memory driver is always
// registered.
package driver
