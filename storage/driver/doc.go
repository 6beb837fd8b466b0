// Package driver is the contract between storage.Open and the drivers:
// the Store interface every driver implements, and the registry of URL
// schemes. Applications do not need it; a driver author does (see
// CONTRIBUTING.md for the checklist).
//
// A driver registers itself — its package, schemes, usage text and
// opener — in an init function:
//
//	func init() {
//		driver.Register(driver.Info{Package: "redisstore", Schemes: []string{"redis", "rediss"}, Usage: usage, Open: openURL})
//	}
//
// so that a program links only the drivers it imports: importing
// storage/redisstore makes storage.Open take redis:// URLs, and importing
// storage/all makes it take every form. The memory driver is always
// registered.
package driver
