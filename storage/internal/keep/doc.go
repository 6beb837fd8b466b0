// Package keep is what the lock drivers share to hand a key from lease to
// lease inside one process without asking the server: which keys are hot
// (Recent), how long a hold may be handed on before other processes get
// their turn (HandOffs), and how many lease fences one fence issued by the
// server stands for (ReservedFences).
package keep
