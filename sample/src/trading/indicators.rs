//! Technical indicators as pure functions over price slices.
//!
//! `get_indicators` (market.rs) ──bars──▶ these functions ──▶ latest values to the model
//!
//! Every function returns a series aligned with its input (`None` while the
//! indicator warms up), so callers take `.last()` and tests can check every
//! point. A series too short for even one value is an error
//! ([`IndicatorError::NotEnoughData`]) rather than an all-`None` series, so
//! the tool can say how many bars were missing. Conventions (they differ
//! between charting packages, so they are stated here):
//! - SMA(n): mean of the last n values.
//! - EMA(n): α = 2/(n+1), seeded with the SMA of the first n values.
//! - RSI(n), Wilder: gains/losses of the close-to-close changes; the first
//!   averages are plain means of the first n changes, then
//!   `avg = (avg·(n−1) + x)/n`. No losses → 100, no gains nor losses → 50.
//!   Needs n+1 closes.
//! - MACD(fast, slow, signal): EMA(fast) − EMA(slow); the signal line is the
//!   EMA(signal) of the MACD line, seeded like any EMA; histogram = MACD −
//!   signal. A point is emitted once the signal exists (slow+signal−1 closes).
//! - Bollinger(n, k): SMA(n) ± k·σ with the population σ of the same window.
//! - True range: `max(h−l, |h−c₋₁|, |l−c₋₁|)` from the second bar on.
//! - ATR(n), Wilder: first value the mean of the first n true ranges (bars
//!   1..=n), then Wilder smoothing. Needs n+1 bars.
//! - VWAP: cumulative Σ(typical price·volume)/Σvolume from the first bar of
//!   the input; typical price = (h+l+c)/3; `None` while the volume is zero.
//! - OBV: starts at 0; adds the volume on an up close, subtracts it on a
//!   down close, keeps it on an unchanged close.
//! - ADX(n): +DM/−DM from the high/low moves, Wilder-smoothed (averages, the
//!   same as Wilder's sums for the DI ratios) with TR; DI = 100·DM/TR,
//!   DX = 100·|+DI−−DI|/(+DI+−DI) (0 when both are 0); ADX's first value is
//!   the mean of the first n DX, then Wilder smoothing. Needs 2n bars.

/// Why an indicator could not be computed.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum IndicatorError {
    #[error("{indicator} needs at least {needed} bars, got {got}")]
    NotEnoughData {
        indicator: &'static str,
        needed: usize,
        got: usize,
    },
    #[error("{indicator}: periods must be at least 1 (and fast < slow for MACD)")]
    BadPeriod { indicator: &'static str },
    #[error("{indicator}: the input series have different lengths")]
    LengthMismatch { indicator: &'static str },
}

pub type Series = Vec<Option<f64>>;

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MacdPoint {
    pub macd: f64,
    pub signal: f64,
    pub histogram: f64,
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Bands {
    pub upper: f64,
    pub middle: f64,
    pub lower: f64,
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AdxPoint {
    pub adx: f64,
    pub plus_di: f64,
    pub minus_di: f64,
}

fn need(indicator: &'static str, needed: usize, got: usize) -> Result<(), IndicatorError> {
    if got < needed {
        Err(IndicatorError::NotEnoughData {
            indicator,
            needed,
            got,
        })
    } else {
        Ok(())
    }
}

fn period(indicator: &'static str, n: usize) -> Result<(), IndicatorError> {
    if n == 0 {
        Err(IndicatorError::BadPeriod { indicator })
    } else {
        Ok(())
    }
}

fn same_len(indicator: &'static str, lens: &[usize]) -> Result<(), IndicatorError> {
    if lens.windows(2).any(|w| w[0] != w[1]) {
        Err(IndicatorError::LengthMismatch { indicator })
    } else {
        Ok(())
    }
}

pub fn sma(values: &[f64], n: usize) -> Result<Series, IndicatorError> {
    period("SMA", n)?;
    need("SMA", n, values.len())?;
    let mut out = vec![None; values.len()];
    let mut sum: f64 = values[..n].iter().sum();
    out[n - 1] = Some(sum / n as f64);
    for i in n..values.len() {
        sum += values[i] - values[i - n];
        out[i] = Some(sum / n as f64);
    }
    Ok(out)
}

pub fn ema(values: &[f64], n: usize) -> Result<Series, IndicatorError> {
    period("EMA", n)?;
    need("EMA", n, values.len())?;
    Ok(ema_from(values, n, 0))
}

/// EMA of `values[start..]`, aligned with `values`; the caller checked that
/// at least `n` values follow `start`.
fn ema_from(values: &[f64], n: usize, start: usize) -> Series {
    let alpha = 2.0 / (n as f64 + 1.0);
    let mut out = vec![None; values.len()];
    let seed_end = start + n - 1;
    let mut prev = values[start..=seed_end].iter().sum::<f64>() / n as f64;
    out[seed_end] = Some(prev);
    for i in seed_end + 1..values.len() {
        prev = alpha * values[i] + (1.0 - alpha) * prev;
        out[i] = Some(prev);
    }
    out
}

/// Wilder smoothing of `values[start..]`: mean of the first n, then
/// `(prev·(n−1) + x)/n`. Aligned with `values`.
fn wilder_from(values: &[f64], n: usize, start: usize) -> Series {
    let mut out = vec![None; values.len()];
    let seed_end = start + n - 1;
    if seed_end >= values.len() {
        return out;
    }
    let mut prev = values[start..=seed_end].iter().sum::<f64>() / n as f64;
    out[seed_end] = Some(prev);
    for i in seed_end + 1..values.len() {
        prev = (prev * (n as f64 - 1.0) + values[i]) / n as f64;
        out[i] = Some(prev);
    }
    out
}

pub fn rsi(closes: &[f64], n: usize) -> Result<Series, IndicatorError> {
    period("RSI", n)?;
    need("RSI", n + 1, closes.len())?;
    // Index i of gains/losses is the change from close i−1 to close i (index 0 unused).
    let mut gains = vec![0.0; closes.len()];
    let mut losses = vec![0.0; closes.len()];
    for i in 1..closes.len() {
        let change = closes[i] - closes[i - 1];
        gains[i] = change.max(0.0);
        losses[i] = (-change).max(0.0);
    }
    let avg_gain = wilder_from(&gains, n, 1);
    let avg_loss = wilder_from(&losses, n, 1);
    Ok(avg_gain
        .iter()
        .zip(&avg_loss)
        .map(|(g, l)| match (g, l) {
            (Some(g), Some(l)) => Some(if *l == 0.0 {
                if *g == 0.0 { 50.0 } else { 100.0 }
            } else {
                100.0 - 100.0 / (1.0 + g / l)
            }),
            _ => None,
        })
        .collect())
}

pub fn macd(
    closes: &[f64],
    fast: usize,
    slow: usize,
    signal: usize,
) -> Result<Vec<Option<MacdPoint>>, IndicatorError> {
    if fast == 0 || signal == 0 || fast >= slow {
        return Err(IndicatorError::BadPeriod { indicator: "MACD" });
    }
    need("MACD", slow + signal - 1, closes.len())?;
    let fast_ema = ema_from(closes, fast, 0);
    let slow_ema = ema_from(closes, slow, 0);
    let first = slow - 1;
    let line: Vec<f64> = (0..closes.len())
        .map(|i| match (fast_ema[i], slow_ema[i]) {
            (Some(f), Some(s)) => f - s,
            _ => 0.0,
        })
        .collect();
    let signal_line = ema_from(&line, signal, first);
    Ok((0..closes.len())
        .map(|i| {
            signal_line[i].map(|s| MacdPoint {
                macd: line[i],
                signal: s,
                histogram: line[i] - s,
            })
        })
        .collect())
}

pub fn bollinger(closes: &[f64], n: usize, k: f64) -> Result<Vec<Option<Bands>>, IndicatorError> {
    period("BB", n)?;
    need("BB", n, closes.len())?;
    let mut out = vec![None; closes.len()];
    for end in n - 1..closes.len() {
        let window = &closes[end + 1 - n..=end];
        let mean = window.iter().sum::<f64>() / n as f64;
        let var = window.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / n as f64;
        let sd = var.sqrt();
        out[end] = Some(Bands {
            upper: mean + k * sd,
            middle: mean,
            lower: mean - k * sd,
        });
    }
    Ok(out)
}

/// True ranges aligned with the bars; index 0 has no previous close, is 0
/// and is never read by the smoothing (which starts at bar 1).
fn true_ranges(highs: &[f64], lows: &[f64], closes: &[f64]) -> Vec<f64> {
    let mut out = vec![0.0; closes.len()];
    for i in 1..closes.len() {
        let prev = closes[i - 1];
        out[i] = (highs[i] - lows[i])
            .max((highs[i] - prev).abs())
            .max((lows[i] - prev).abs());
    }
    out
}

pub fn atr(
    highs: &[f64],
    lows: &[f64],
    closes: &[f64],
    n: usize,
) -> Result<Series, IndicatorError> {
    period("ATR", n)?;
    same_len("ATR", &[highs.len(), lows.len(), closes.len()])?;
    need("ATR", n + 1, closes.len())?;
    Ok(wilder_from(&true_ranges(highs, lows, closes), n, 1))
}

pub fn vwap(
    highs: &[f64],
    lows: &[f64],
    closes: &[f64],
    volumes: &[f64],
) -> Result<Series, IndicatorError> {
    same_len(
        "VWAP",
        &[highs.len(), lows.len(), closes.len(), volumes.len()],
    )?;
    need("VWAP", 1, closes.len())?;
    let (mut pv, mut vol) = (0.0, 0.0);
    Ok((0..closes.len())
        .map(|i| {
            let typical = (highs[i] + lows[i] + closes[i]) / 3.0;
            pv += typical * volumes[i];
            vol += volumes[i];
            (vol > 0.0).then(|| pv / vol)
        })
        .collect())
}

pub fn obv(closes: &[f64], volumes: &[f64]) -> Result<Vec<f64>, IndicatorError> {
    same_len("OBV", &[closes.len(), volumes.len()])?;
    need("OBV", 1, closes.len())?;
    let mut out = vec![0.0; closes.len()];
    for i in 1..closes.len() {
        out[i] = out[i - 1]
            + if closes[i] > closes[i - 1] {
                volumes[i]
            } else if closes[i] < closes[i - 1] {
                -volumes[i]
            } else {
                0.0
            };
    }
    Ok(out)
}

pub fn adx(
    highs: &[f64],
    lows: &[f64],
    closes: &[f64],
    n: usize,
) -> Result<Vec<Option<AdxPoint>>, IndicatorError> {
    period("ADX", n)?;
    same_len("ADX", &[highs.len(), lows.len(), closes.len()])?;
    need("ADX", 2 * n, closes.len())?;
    let len = closes.len();
    let mut plus_dm = vec![0.0; len];
    let mut minus_dm = vec![0.0; len];
    for i in 1..len {
        let up = highs[i] - highs[i - 1];
        let down = lows[i - 1] - lows[i];
        if up > down && up > 0.0 {
            plus_dm[i] = up;
        }
        if down > up && down > 0.0 {
            minus_dm[i] = down;
        }
    }
    let tr = wilder_from(&true_ranges(highs, lows, closes), n, 1);
    let pdm = wilder_from(&plus_dm, n, 1);
    let mdm = wilder_from(&minus_dm, n, 1);
    // DI and DX exist from bar n on.
    let mut di = vec![(0.0, 0.0); len];
    let mut dx = vec![0.0; len];
    for i in n..len {
        let (Some(tr), Some(p), Some(m)) = (tr[i], pdm[i], mdm[i]) else {
            continue;
        };
        let (pdi, mdi) = if tr > 0.0 {
            (100.0 * p / tr, 100.0 * m / tr)
        } else {
            (0.0, 0.0)
        };
        di[i] = (pdi, mdi);
        dx[i] = if pdi + mdi > 0.0 {
            100.0 * (pdi - mdi).abs() / (pdi + mdi)
        } else {
            0.0
        };
    }
    let adx = wilder_from(&dx, n, n);
    Ok((0..len)
        .map(|i| {
            adx[i].map(|a| AdxPoint {
                adx: a,
                plus_di: di[i].0,
                minus_di: di[i].1,
            })
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-9
    }

    fn assert_series(got: &[Option<f64>], want: &[Option<f64>]) {
        assert_eq!(got.len(), want.len(), "{got:?} vs {want:?}");
        for (g, w) in got.iter().zip(want) {
            match (g, w) {
                (Some(g), Some(w)) => assert!(close(*g, *w), "{got:?} vs {want:?}"),
                (None, None) => {}
                _ => panic!("{got:?} vs {want:?}"),
            }
        }
    }

    // Six bars (high, low, close), shared by ATR, ADX and VWAP:
    //   0: (10, 8, 9)   1: (11, 9, 10)   2: (12, 10, 11)
    //   3: (11, 8, 9)   4: (13, 10, 12)  5: (12, 11, 11.5)
    const H: [f64; 6] = [10.0, 11.0, 12.0, 11.0, 13.0, 12.0];
    const L: [f64; 6] = [8.0, 9.0, 10.0, 8.0, 10.0, 11.0];
    const C: [f64; 6] = [9.0, 10.0, 11.0, 9.0, 12.0, 11.5];

    #[test]
    fn sma_by_hand() {
        // [1,2,3,4,5], n=3: (1+2+3)/3=2, (2+3+4)/3=3, (3+4+5)/3=4
        let s = sma(&[1.0, 2.0, 3.0, 4.0, 5.0], 3).unwrap();
        assert_series(&s, &[None, None, Some(2.0), Some(3.0), Some(4.0)]);
    }

    #[test]
    fn ema_by_hand() {
        // [2,4,6,8,4], n=3, α=2/4=0.5. Seed SMA(2,4,6)=4;
        // then 0.5·8+0.5·4=6; 0.5·4+0.5·6=5.
        let s = ema(&[2.0, 4.0, 6.0, 8.0, 4.0], 3).unwrap();
        assert_series(&s, &[None, None, Some(4.0), Some(6.0), Some(5.0)]);
    }

    #[test]
    fn rsi_wilder_by_hand() {
        // closes [10, 11, 10.5, 11.5, 12, 11], n=3
        // changes: +1, −0.5, +1, +0.5, −1
        // bar 3: avg gain (1+0+1)/3 = 2/3, avg loss 0.5/3 = 1/6, RS = 4, RSI = 100−100/5 = 80
        // bar 4: gain (2/3·2+0.5)/3 = 11/18, loss (1/6·2+0)/3 = 1/9, RS = 5.5,
        //        RSI = 100−100/6.5 = 84.6153846…
        // bar 5: gain (11/18·2+0)/3 = 11/27, loss (1/9·2+1)/3 = 11/27, RS = 1, RSI = 50
        let s = rsi(&[10.0, 11.0, 10.5, 11.5, 12.0, 11.0], 3).unwrap();
        assert_series(
            &s,
            &[
                None,
                None,
                None,
                Some(80.0),
                Some(100.0 - 100.0 / 6.5),
                Some(50.0),
            ],
        );
    }

    #[test]
    fn rsi_of_flat_and_rising_series() {
        // No gains nor losses → 50; only gains → 100.
        assert_eq!(rsi(&[5.0; 4], 3).unwrap()[3], Some(50.0));
        assert_eq!(rsi(&[1.0, 2.0, 3.0, 4.0], 3).unwrap()[3], Some(100.0));
    }

    #[test]
    fn macd_by_hand() {
        // closes [2,4,6,8,4,6], fast 2 (α=2/3), slow 3 (α=1/2), signal 2 (α=2/3)
        // EMA2: seed (2+4)/2=3 @1; 2/3·6+1/3·3=5 @2; 2/3·8+1/3·5=7 @3;
        //       2/3·4+1/3·7=5 @4; 2/3·6+1/3·5=17/3 @5
        // EMA3: seed 4 @2; 6 @3; 5 @4; 0.5·6+0.5·5=5.5 @5
        // MACD: 1 @2; 1 @3; 0 @4; 17/3−5.5=1/6 @5
        // signal: seed (1+1)/2=1 @3; 2/3·0+1/3·1=1/3 @4; 2/3·1/6+1/3·1/3=2/9 @5
        // histogram: 0 @3; −1/3 @4; 1/6−2/9=−1/18 @5
        let s = macd(&[2.0, 4.0, 6.0, 8.0, 4.0, 6.0], 2, 3, 2).unwrap();
        assert!(s[..3].iter().all(Option::is_none));
        let want = [
            (1.0, 1.0, 0.0),
            (0.0, 1.0 / 3.0, -1.0 / 3.0),
            (1.0 / 6.0, 2.0 / 9.0, -1.0 / 18.0),
        ];
        for (p, (m, sig, h)) in s[3..].iter().zip(want) {
            let p = p.unwrap();
            assert!(close(p.macd, m) && close(p.signal, sig) && close(p.histogram, h));
        }
    }

    #[test]
    fn bollinger_by_hand() {
        // [2,4,6,8,2], n=3, k=2
        // @2: window [2,4,6], mean 4, var (4+0+4)/3 = 8/3, σ = √(8/3)
        // @4: window [6,8,2], mean 16/3, deviations 2/3, 8/3, −10/3,
        //     var (4/9+64/9+100/9)/3 = 56/9, σ = √56/3
        let s = bollinger(&[2.0, 4.0, 6.0, 8.0, 2.0], 3, 2.0).unwrap();
        assert!(s[0].is_none() && s[1].is_none());
        let b = s[2].unwrap();
        let sd = (8.0f64 / 3.0).sqrt();
        assert!(close(b.middle, 4.0) && close(b.upper, 4.0 + 2.0 * sd));
        assert!(close(b.lower, 4.0 - 2.0 * sd));
        let b = s[4].unwrap();
        let sd = 56.0f64.sqrt() / 3.0;
        assert!(close(b.middle, 16.0 / 3.0) && close(b.upper, 16.0 / 3.0 + 2.0 * sd));
    }

    #[test]
    fn atr_wilder_by_hand() {
        // TR: @1 max(2, |11−9|, |9−9|) = 2; @2 max(2, 2, 0) = 2; @3 max(3, |11−11|, |8−11|) = 3;
        //     @4 max(3, |13−9|, |10−9|) = 4; @5 max(1, |12−12|, |11−12|) = 1
        // n=3: @3 (2+2+3)/3 = 7/3; @4 (7/3·2+4)/3 = 26/9; @5 (26/9·2+1)/3 = 61/27
        let s = atr(&H, &L, &C, 3).unwrap();
        assert_series(
            &s,
            &[
                None,
                None,
                None,
                Some(7.0 / 3.0),
                Some(26.0 / 9.0),
                Some(61.0 / 27.0),
            ],
        );
    }

    #[test]
    fn adx_by_hand() {
        // up = hᵢ−hᵢ₋₁, down = lᵢ₋₁−lᵢ:
        //   @1 up 1, down −1 → +DM 1; @2 up 1, down −1 → +DM 1; @3 up −1, down 2 → −DM 2;
        //   @4 up 2, down −2 → +DM 2; @5 up −1, down −1 → none. TR as in the ATR test.
        // n=2, Wilder averages:
        //   @2: TR (2+2)/2 = 2, +DM 1, −DM 0 → +DI 50, −DI 0, DX 100
        //   @3: TR (2+3)/2 = 2.5, +DM 0.5, −DM 1 → +DI 20, −DI 40, DX 100·20/60 = 100/3
        //   ADX @3 = (100 + 100/3)/2 = 200/3
        //   @4: TR 3.25, +DM 1.25, −DM 0.5 → DX 100·0.75/1.75 = 300/7; ADX (200/3+300/7)/2 = 2300/42
        //   @5: TR 2.125, +DM 0.625, −DM 0.25 → +DI 100·0.625/2.125, DX 100·0.375/0.875 = 300/7;
        //       ADX (2300/42 + 300/7)/2 = 4100/84
        let s = adx(&H, &L, &C, 2).unwrap();
        assert!(s[..3].iter().all(Option::is_none));
        let got: Vec<f64> = s[3..].iter().map(|p| p.unwrap().adx).collect();
        for (g, w) in got.iter().zip([200.0 / 3.0, 2300.0 / 42.0, 4100.0 / 84.0]) {
            assert!(close(*g, w), "{got:?}");
        }
        let last = s[5].unwrap();
        assert!(close(last.plus_di, 100.0 * 0.625 / 2.125));
        assert!(close(last.minus_di, 100.0 * 0.25 / 2.125));
    }

    #[test]
    fn vwap_by_hand_and_zero_volume() {
        // typical: @0 (10+8+9)/3 = 9, @1 10, @2 11, @3 28/3; volumes 100, 300, 0, 200
        // @0 9·100/100 = 9; @1 (900+3000)/400 = 9.75; @2 unchanged 9.75;
        // @3 (3900 + 28/3·200)/600 = (3900+5600/3)/600 = 17300/1800
        let v = [100.0, 300.0, 0.0, 200.0];
        let s = vwap(&H[..4], &L[..4], &C[..4], &v).unwrap();
        assert_series(
            &s,
            &[Some(9.0), Some(9.75), Some(9.75), Some(17300.0 / 1800.0)],
        );
        // No volume yet → no VWAP yet.
        let s = vwap(&H[..2], &L[..2], &C[..2], &[0.0, 300.0]).unwrap();
        assert_series(&s, &[None, Some(10.0)]);
    }

    #[test]
    fn obv_by_hand() {
        // closes 10, 11 (+200), 11 (=), 10.5 (−400), 12 (+500): 0, 200, 200, −200, 300
        let s = obv(
            &[10.0, 11.0, 11.0, 10.5, 12.0],
            &[100.0, 200.0, 300.0, 400.0, 500.0],
        )
        .unwrap();
        assert_eq!(s, vec![0.0, 200.0, 200.0, -200.0, 300.0]);
    }

    #[test]
    fn short_series_and_bad_input_are_errors() {
        let short = [1.0, 2.0];
        assert_eq!(
            sma(&short, 3),
            Err(IndicatorError::NotEnoughData {
                indicator: "SMA",
                needed: 3,
                got: 2
            })
        );
        assert!(matches!(
            rsi(&[1.0, 2.0, 3.0], 3),
            Err(IndicatorError::NotEnoughData { needed: 4, .. })
        ));
        assert!(matches!(
            macd(&[1.0; 33], 12, 26, 9),
            Err(IndicatorError::NotEnoughData { needed: 34, .. })
        ));
        assert!(macd(&[1.0; 34], 12, 26, 9).is_ok());
        assert!(matches!(
            adx(&H[..3], &L[..3], &C[..3], 2),
            Err(IndicatorError::NotEnoughData { needed: 4, .. })
        ));
        assert!(matches!(
            atr(&H[..3], &L[..3], &C[..3], 3),
            Err(IndicatorError::NotEnoughData { needed: 4, .. })
        ));
        assert!(vwap(&[], &[], &[], &[]).is_err());
        assert!(obv(&[], &[]).is_err());
        assert_eq!(
            ema(&short, 0),
            Err(IndicatorError::BadPeriod { indicator: "EMA" })
        );
        assert!(macd(&[1.0; 40], 26, 12, 9).is_err());
        assert_eq!(
            atr(&H, &L[..5], &C, 3),
            Err(IndicatorError::LengthMismatch { indicator: "ATR" })
        );
    }
}
